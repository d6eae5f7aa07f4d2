// A paged case's query rows in global order at rank 0: the candidate's digest, the dump (when
// one is written), and the hidden states the dlogp leg projects.
#pragma once

#include <string>
#include <vector>

#include "cpdrift/engine/case_runner.h"
#include "cpdrift/paged/paged_workload.h"

namespace cpd::paged {

struct Published {
  std::string candidate_out, candidate_lse;  // SHA-256 at rank 0, "" elsewhere
  // Rank 0: [B][Hq][q_len][D] attention outputs of every query row, candidate and reference.
  std::vector<float> candidate_hidden, reference_hidden;
};

/// Streams `candidate` and `reference` (this process's heads `kv_heads`; written as the case
/// writes them) to rank 0 in global [B, Hq, q_len] order. Collective.
Published publish_rows(const RunContext& ctx, const PagedWorkload& w, const std::string& case_name,
                       const AttnShard& candidate, const AttnShard& reference, Range kv_heads,
                       bool bf16);

/// Target-token logprobs of the candidate vs the reference hidden states through the synthetic
/// lm_head (per-head partial logits folded in ascending head order, as the prefill cases do),
/// computed on rank 0. Collective (the statistics).
DiffStats dlogp_drift(const RunContext& ctx, const PagedWorkload& w, const Published& rows,
                      int vocab);

}  // namespace cpd::paged
