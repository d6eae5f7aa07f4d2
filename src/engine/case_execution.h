// The record of what a case's run did, read off what executed (docs/style.md, "the record says
// what ran").
#pragma once

#include <chrono>
#include <vector>

#include "engine/case_outputs.h"
#include "engine/protocol.h"
#include "engine/run_context.h"

namespace cpd {

/// A block message a hosted query owner received and used: a partial state or a partial dq.
struct Received {
  int tp_rank = 0;  // of the query owner
  int cp_rank = 0;
  MessageHeader header;
};

/// Which blocks every query owner merged (from the headers of the FP32 path's validated
/// states, `fp32`: one per hosted rank) and folded into its dq (`dq_partials`, when the backward
/// ran), which backend, device and transport ran, on how many processes, and what the transport
/// moved since `before` but for `excluded` (the CP=1 reference's exchange: this tool's check).
/// Collective: every process returns the same record.
CaseExecution record_execution(const RunContext& ctx, const CaseGrid& grid,
                               const std::vector<RankOutput>& fp32,
                               const std::vector<Received>& dq_partials,
                               const TransportCounters& before, const TransportCounters& excluded,
                               std::chrono::steady_clock::time_point started);

}  // namespace cpd
