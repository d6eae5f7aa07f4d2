// The rollout side's attention calls: decode steps, a paged prefill and a full prefill read
// through the paged cache, and the trainer's contiguous call they are compared with. All of
// them are the canonical fold over split-KV blocks (docs/numerics.md), run by the backend.
#pragma once

#include <span>

#include "engine/paged/paged_cache.h"
#include "engine/paged/paged_workload.h"
#include "engine/paged/split_plan.h"
#include "kernels/attention_backend.h"

namespace cpd {

enum class PagedCall {
  decode,           // one call per query position t, one row, context [0, t+1)
  paged_prefill,    // one call: the q_len query rows at the end of the context
  full_prefill,     // one call: every position of the sequence (the trainer's prefill)
  chunked_prefill,  // contiguous only: query chunks of 3 pages, chunk [a, e) with context [0, e)
};

/// What one lane computes: the call, the split plan, and the arithmetic of P·V.
struct Lane {
  PagedCall call = PagedCall::decode;
  SplitKv split;
  ProbRounding rounding = ProbRounding::none;
};

/// Runs `lane` for every sequence of `cache` and KV heads `kv_heads` (with their query heads).
/// `q` holds the queries [B][q heads][S][D]; sequence s of the cache reads batch row
/// q_batch[s]. Auto plans see the cache's sequence count as the batch. Result: out
/// [seqs][q heads][rows][D], lse [seqs][q heads][rows][1], where for decode and paged_prefill
/// row i is position kv_len − q_len + i, and for full_prefill row i is position i (rows past a
/// sequence's length stay 0). `plans_used`, when given and kv_heads is not empty, receives per
/// sequence the split plan its last call ran with (the one at its full context).
AttnShard run_paged_lane(const Lane& lane, const PagedKvCache& cache, std::int64_t q_len,
                         const Shard& q, std::span<const int> q_batch, Range kv_heads, int group,
                         float scale, AttentionBackend& backend,
                         std::vector<std::vector<Range>>* plans_used = nullptr);

/// The query rows ([seqs][q heads][q_len], like a paged_prefill lane) computed from contiguous
/// K and V ([B][kv heads][S][D]), no cache: `lane.call` paged_prefill is one call of the q_len
/// rows; chunked_prefill is the trainer's chunked prefill — every chunk that holds a query row,
/// its query rows attending [0, chunk end) with the lane's plan at that context.
AttnShard run_contiguous_lane(const Lane& lane, const PagedWorkload& w, const Shard& k,
                              const Shard& v, const Shard& q, Range kv_heads, int group,
                              float scale, AttentionBackend& backend);

}  // namespace cpd
