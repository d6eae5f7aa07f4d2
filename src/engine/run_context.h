// What the cases of a run share on one process: the problem, the workers, the compute backend
// (through the input memo), how messages and counters move, and the memoised CP=1 results.
#pragma once

#include "comm/collectives.h"
#include "comm/transport.h"
#include "engine/backward.h"
#include "engine/local_cp1.h"
#include "engine/run_progress.h"
#include "kernels/input_store.h"

namespace cpd {

struct DecodedCapture;

struct RunContext {
  Problem problem;
  ThreadPool& pool;
  InputStore& inputs;  // its backend computes everything
  Transport& transport;
  const Collectives& collectives;
  LocalCp1Results& cp1_results;
  LocalCp1Backward* cp1_backward = nullptr;  // set: run the backward leg (--include-backward)
  bool te_p2p_backward = false;  // the backward's te_p2p lane too (--include-lane-backward)
  /// Set on GPU runs: the CPU backend's inputs, to run the FP32 path again on the CPU and show
  /// the two backends agree bit for bit (cuda_vs_cpu_fp32).
  InputStore* cpu_rerun_inputs = nullptr;
  int vocab_size = 0;               // > 0: run the dlogp leg (--include-dlogp)
  std::int64_t round_rows = 0;      // CaseGrid::round_rows of every case (0: from the budget)
  RunProgress* progress = nullptr;  // set: run_case reports each phase as it ends
  /// Set when the run has prefill and paged cases: each gathers its rows at the rollout's
  /// decoded positions here for the trainer-vs-rollout pairs (rollout_pairs.h).
  DecodedCapture* decoded = nullptr;
};

}  // namespace cpd
