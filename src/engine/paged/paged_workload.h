// The rollout workload a run measures: problem.batch sequences of different lengths that share
// a prompt prefix, each with q_len query tokens at its end (design §7's paged lanes).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/model.h"
#include "core/range.h"
#include "core/shard.h"
#include "kernels/cpu/inputs.h"

namespace cpd {

class InputStore;

struct PagedWorkload {
  int page_size = 16;
  std::int64_t q_len = 1;
  std::vector<std::int64_t> kv_lens;  // per sequence
  std::int64_t prefix_len = 0;        // the shared prompt's whole pages (cached once)

  int sequences() const { return static_cast<int>(kv_lens.size()); }
  int prefix_pages() const { return static_cast<int>(prefix_len / page_size); }
  /// The query positions of sequence `seq`: the last q_len of its context.
  Range queries(int seq) const {
    const std::int64_t len = kv_lens[static_cast<std::size_t>(seq)];
    return Range{len - q_len, len};
  }
};

/// Sequence b holds kv_len = S − b·⌊S/(4B)⌋ − b tokens, the first kv_len of the problem's
/// sequence b; the whole pages of the problem's shared prompt (shared_prompt_len, none with one
/// sequence) are cached once; q_len defaults to min(16, ⌊(shortest − prompt) / 2⌋). Throws
/// UsageError when the problem is too short for the page size or the requested q_len.
PagedWorkload make_paged_workload(const Problem& problem, int page_size,
                                  std::optional<std::int64_t> q_len);

/// The workload's logical K and V of KV heads `heads` ([B][heads][S][D]; positions past a
/// sequence's length are unused): the problem's tensors, whose sequences share the prompt.
struct LogicalKv {
  Shard k, v;
};
LogicalKv logical_kv(const PagedWorkload& w, InputStore& inputs, Range heads,
                     InputPrecision precision);

}  // namespace cpd
