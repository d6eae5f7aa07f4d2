// The training and logprob legs of a case (--include-backward, --include-dlogp): what each
// computes, compares and publishes, added to the case's outputs.
#pragma once

#include <vector>

#include "case_execution.h"
#include "cpdrift/engine/case_outputs.h"
#include "cpdrift/engine/protocol.h"
#include "cpdrift/engine/run_context.h"

namespace cpd::case_legs {

/// The FP32 backward from the FP32 path's forward (`fp32`, one per hosted rank) vs the CP=1
/// reference backward, and the gradients' BF16 final write.
/// Returns the partial dq the hosted query owners folded (for the record of what ran).
std::vector<Received> add_backward(const RunContext& ctx, const CaseGrid& grid,
                                   const std::vector<RankOutput>& fp32, CaseOutputs& o);

/// Target-token logprobs of `candidate` vs `reference` (attention outputs per hosted rank)
/// through the synthetic lm_head, over the active tokens.
void add_dlogp(const RunContext& ctx, const CaseGrid& grid,
               const std::vector<const AttnShard*>& candidate,
               const std::vector<const AttnShard*>& reference, CaseOutputs& o);

}  // namespace cpd::case_legs
