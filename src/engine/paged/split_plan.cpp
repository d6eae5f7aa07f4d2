#include "engine/paged/split_plan.h"

#include <algorithm>

#include "core/plan.h"
#include "engine/paged/page_table.h"

namespace cpd {

const char* to_string(SplitPolicy p) { return name_of(kSplitPolicyNames, p); }

std::vector<Range> split_blocks(const SplitKv& split, std::int64_t kv_len, int batch,
                                int page_size) {
  std::int64_t size = kv_len;
  if (split.policy == SplitPolicy::fixed) size = split.size;
  if (split.policy == SplitPolicy::auto_select) {
    const std::int64_t splits = std::max(1, 8 / std::max(1, batch));
    size =
        std::max<std::int64_t>(1, (pages_for(kv_len, page_size) + splits - 1) / splits) * page_size;
  }
  if (kv_len <= 0) return {};
  return split_range(Range{0, kv_len}, size);
}

std::string coverage_error(const std::vector<Range>& blocks, std::int64_t kv_len) {
  std::int64_t at = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Range& b = blocks[i];
    if (b.begin != at || b.empty()) {
      return "block " + std::to_string(i) + " [" + std::to_string(b.begin) + ", " +
             std::to_string(b.end) + ") does not continue the plan at " + std::to_string(at);
    }
    at = b.end;
  }
  if (at != kv_len)
    return "the plan covers [0, " + std::to_string(at) + ") of [0, " + std::to_string(kv_len) + ")";
  return "";
}

}  // namespace cpd
