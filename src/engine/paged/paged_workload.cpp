#include "engine/paged/paged_workload.h"

#include <algorithm>

#include "core/errors.h"
#include "kernels/input_store.h"

namespace cpd {

PagedWorkload make_paged_workload(const Problem& p, int page_size,
                                  std::optional<std::int64_t> q_len) {
  if (page_size < 1) throw UsageError("--page-size: must be at least 1");
  if (page_size > p.seq_len) {
    throw UsageError("--page-size " + std::to_string(page_size) + ": larger than --seq-len " +
                     std::to_string(p.seq_len));
  }
  const std::int64_t page = page_size;
  PagedWorkload w;
  w.page_size = page_size;
  const std::int64_t step = p.seq_len / (4 * p.batch);
  for (int b = 0; b < p.batch; ++b) w.kv_lens.push_back(p.seq_len - b * step - b);
  const std::int64_t shortest = w.kv_lens.back();
  if (shortest < 2) {
    throw UsageError("paged modes: --seq-len " + std::to_string(p.seq_len) +
                     " is too short for --batch " + std::to_string(p.batch) +
                     " (the shortest sequence would hold " + std::to_string(shortest) + " tokens)");
  }
  // The shared prompt's whole pages are cached once (a partial last page stays private, as
  // in vLLM's prefix cache); the decoded tokens come after the prompt.
  const std::int64_t prompt = shared_prompt_len(p);
  w.prefix_len = prompt / page * page;
  const std::int64_t room = shortest - prompt;
  w.q_len = q_len.value_or(std::clamp<std::int64_t>(room / 2, 1, 16));
  if (w.q_len < 1 || w.q_len > room) {
    throw UsageError("--q-len " + std::to_string(w.q_len) + ": the shortest sequence (" +
                     std::to_string(shortest) + " tokens, " + std::to_string(prompt) +
                     " of them the shared prompt) has room for 1 to " + std::to_string(room) +
                     " query tokens");
  }
  return w;
}

LogicalKv logical_kv(const PagedWorkload&, InputStore& inputs, Range heads,
                     InputPrecision precision) {
  const Problem& p = inputs.problem();
  const ShardShape shape{p.batch, heads, {Range{0, p.seq_len}}, p.dims.head_dim};
  // The problem's own rows: its sequences already share the prompt (shared_prompt_len).
  LogicalKv kv{inputs.shard(TensorId::k, shape, precision),
               inputs.shard(TensorId::v, shape, precision)};
  return kv;
}

}  // namespace cpd
