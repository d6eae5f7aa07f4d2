// Split-KV plans of the rollout side: how one attention call's KV context is cut into blocks
// whose partial states merge in ascending order (design §1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/range.h"
#include "cpdrift/enum_names.h"

namespace cpd {

enum class SplitPolicy { disabled, fixed, auto_select };
inline constexpr EnumName<SplitPolicy> kSplitPolicyNames[] = {{SplitPolicy::disabled, "disabled"},
                                                              {SplitPolicy::fixed, "fixed"},
                                                              {SplitPolicy::auto_select, "auto"}};
const char* to_string(SplitPolicy);

struct SplitKv {
  SplitPolicy policy = SplitPolicy::disabled;
  std::int64_t size = 0;  // tokens, fixed only
  friend bool operator==(const SplitKv&, const SplitKv&) = default;
};

/// The blocks of one call whose context is [0, kv_len): disabled, one block; fixed,
/// [0,c), [c,2c), …, the last shorter — the same global grid at every context length, so a
/// decode step's blocks are the full prefill's blocks cut at the step; auto, the fixed cut at
/// a size picked the way engines pick a split count — enough splits to fill 8 workers,
/// max(1, 8 / batch), the size rounded up to whole pages — which depends on the batch and
/// the length, so auto is a diagnostic and never evidence of invariance.
std::vector<Range> split_blocks(const SplitKv& split, std::int64_t kv_len, int batch,
                                int page_size);

/// "" when `blocks` tile [0, kv_len) in ascending order without gaps, overlap or empty
/// blocks; else what is wrong.
std::string coverage_error(const std::vector<Range>& blocks, std::int64_t kv_len);

}  // namespace cpd
