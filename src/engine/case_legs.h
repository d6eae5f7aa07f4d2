// The training and logprob legs of a case (--include-backward, --include-dlogp): what each
// computes, compares and publishes, added to the case's outputs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/case_execution.h"
#include "engine/case_sink.h"
#include "engine/protocol.h"
#include "engine/run_context.h"

namespace cpd::case_legs {

/// What the backward leg leaves for the case's record.
struct BackwardRecord {
  std::vector<Received> folded;  // the partial dq the hosted query owners folded
  /// What the CP=1 reference's exchange moved (this tool's check, not the case's traffic).
  TransportCounters reference_traffic;
};

/// The FP32 backward from the FP32 path's forward (`fp32`, one per hosted rank) vs the CP=1
/// reference backward (shared_cp1_backward, from `reference`: the CP=1 FP32 forward of each
/// hosted rank, released through `release_reference` once the reference backward has the rows
/// it needs), and the gradients' BF16 final write: one part of case `name`, handed to `sink`.
BackwardRecord add_backward(const RunContext& ctx, const CaseGrid& grid, const std::string& name,
                            const std::vector<RankOutput>& fp32,
                            const std::vector<const AttnShard*>& reference,
                            const std::function<void()>& release_reference, CaseSink& sink);

/// Target-token logprobs of `candidate` vs `reference` (attention outputs per hosted rank)
/// through the synthetic lm_head, over the active tokens: one part of case `name`.
void add_dlogp(const RunContext& ctx, const CaseGrid& grid, const std::string& name,
               const std::vector<const AttnShard*>& candidate,
               const std::vector<const AttnShard*>& reference, CaseSink& sink);

}  // namespace cpd::case_legs
