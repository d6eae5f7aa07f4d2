// A prefill/chunked case while its schedule runs: what its phases hand each other, and the
// phases' run functions (case_runner.cpp, case_legs.cpp).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "engine/case_execution.h"
#include "engine/case_schedule.h"
#include "engine/case_sink.h"
#include "engine/o_proj.h"
#include "engine/run_context.h"

namespace cpd {

/// One attention tensor of a case: this process's shard of it per hosted rank.
using HostedAttention = std::vector<const AttnShard*>;

struct CaseRun {
  CaseRun(const RunContext& ctx, const CaseGrid& grid, CaseSink& sink)
      : ctx(ctx), grid(grid), sink(sink) {}

  const RunContext& ctx;
  const CaseGrid& grid;
  CaseSink& sink;
  CaseRecord record;
  TransportCounters before;  // the transport's counters when the case began

  // The FP32 CP=1 reference of every hosted rank's rows (the same rows on every path).
  HeldTensors references;
  HostedAttention reference;
  // The FP32 path's runs (the backward starts from them), the dtype path's under --dtype bf16,
  // and the dtype path's output as written: dlogp's candidate.
  std::vector<RankOutput> fp32, dtype_runs;
  HostedAttention dtype_written;
  // The CP=1 reference backward's gradients per hosted rank, and what its exchange moved (this
  // tool's check, not the case's traffic).
  std::vector<LocalCp1Backward::Result> reference_gradients;
  TransportCounters reference_traffic;
  // --scope layer: the backward's gradients, kept for the layer's backward (which publishes them).
  std::vector<RankGradients> gradients;
  // The partial dq the hosted query owners folded.
  std::vector<Received> folded;
  // The layer's output on the hosted token owners (--scope layer), as written: dlogp reads it.
  std::vector<LayerOutputs> layer;

  /// Frees the CP=1 references (once the reference backward has the rows it needs).
  void release_references() {
    reference.clear();
    references = HeldTensors{};
  }
};

/// What each kind of phase runs (the schedule binds them).
namespace phase_run {
void reference_forward(CaseRun& run);
void forward_path(CaseRun& run, const ForwardPath& path);
void o_proj(CaseRun& run);
void dlogp(CaseRun& run);
void reference_backward(CaseRun& run);
void backward(CaseRun& run);
/// --scope layer: the layer's gradients from the core's (the candidate's and the reference's, which
/// the backward published and kept in the run), published as one part; frees them and the
/// references.
void layer_backward(CaseRun& run);
}  // namespace phase_run

}  // namespace cpd
