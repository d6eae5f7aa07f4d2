// One case end to end: the three arithmetic paths through the CP protocol, the CP=1
// reference and topology counterpart, the merge checks, and every drift statistic.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cpdrift/core/plan.h"
#include "cpdrift/engine/backward.h"
#include "cpdrift/engine/collectives.h"
#include "cpdrift/engine/local_cp1.h"
#include "cpdrift/engine/transport.h"
#include "cpdrift/io/tensor_dump.h"
#include "cpdrift/metrics/diff_stats.h"

namespace cpd {

/// What a run's cases share: the problem, the workers, how bytes and counters move, and the
/// memoised CP=1 results.
struct RunContext {
  Problem problem;
  ThreadPool& pool;
  InputStore& inputs;
  Transport& transport;
  const Collectives& collectives;
  LocalCp1Results& cp1_results;
  bool dump_requested = false;               // every process streams the dumped tensors to rank 0
  TensorDump* dump = nullptr;                // rank 0's writer when dumping
  LocalCp1Backward* cp1_backward = nullptr;  // set: run the backward leg (--include-backward)
  InputStore* cpu_check = nullptr;  // set (GPU runs): the FP32 path again on the CPU backend
  int vocab_size = 0;               // > 0: run the dlogp leg (--include-dlogp)
};

/// Drift of one candidate tensor pair against its reference.
struct OutLseStats {
  DiffStats out;
  DiffStats lse;
  bool bitwise_equal() const { return out.bitwise_equal() && lse.bitwise_equal(); }
};

/// Drift of one CP query shard (all TP ranks' heads of it).
struct PerRankDrift {
  int cp_rank = 0;
  std::vector<Range> tokens;
  OutLseStats candidate;  // the case's dtype path vs the FP32 reference
  OutLseStats cp_merge;   // the FP32 candidate vs the FP32 reference
};

/// The backward leg (report `backward`): the case's FP32 gradients vs the CP=1 reference.
struct BackwardDrift {
  struct PerRank {
    int cp_rank = 0;
    DiffStats dq, dk, dv;  // over the CP query shard (dq) and KV shard (dk, dv)
  };
  bool available = false;
  DiffStats dq, dk, dv;
  DiffStats bf16_dq, bf16_dk, bf16_dv;  // the gradients' BF16 final write vs the FP32 reference
  std::vector<PerRank> per_rank;
};

/// The dlogp leg (report `dlogp`): target-token logprobs of the BF16 CP output vs the FP32
/// CP=1 output cast to BF16, through the synthetic lm_head.
struct DlogpDrift {
  bool available = false;
  int vocab_size = 0;
  DiffStats drift;  // over the active tokens
};

struct CaseResult {
  CaseSpec spec;
  std::string name;
  OutLseStats cp_merge_fp32;       // FP32 CP/chunked vs FP32 CP=1 prefill
  OutLseStats dtype_path;          // problem dtype inputs + final write vs FP32 reference
  OutLseStats bf16_kernel;         // emulated BF16 flash kernel vs FP32 reference
  OutLseStats topology;            // FP32 candidate vs FP32 CP=1 with the same split and layout
  bool topology_required = false;  // the block grids are equal, so the bits must be
  std::string topology_reference;  // the CP=1 counterpart's case name
  OutLseStats merge_probe;         // reversed arrival order vs canonical: must be exactly 0
  OutLseStats merge_oracle;        // FP32 fold vs FP64 oracle on the same states
  std::vector<PerRankDrift> per_rank;
  TransportCounters moved;  // bytes and messages this case's protocols moved
  double seconds = 0.0;
  /// The distributed run as it happened (FP32 path): processes the case's ranks ran on, and
  /// per CP query owner the global block indices it actually merged.
  int processes_used = 1;
  std::vector<std::vector<int>> merged_block_indices;
  BackwardDrift backward;
  DlogpDrift dlogp;
  /// GPU runs: the cuBLAS unfused path's drift, and the FP32 path on the GPU vs on the CPU
  /// (must be bitwise equal: the canonical order is the same on both).
  std::optional<OutLseStats> cublas_unfused;
  std::optional<OutLseStats> cuda_vs_cpu_fp32;
};

/// The final write of an attention output: `out` rounded once to BF16 when `bf16` (lse stays
/// FP32, as flash kernels keep it); a copy otherwise.
AttnShard final_write(const AttnShard& merged, bool bf16);
/// A tensor rounded once to BF16 (kept in FP32 storage): the final write of a BF16 kernel.
Shard bf16_written(const Shard& s);

/// Runs one case. Collective over the transport's processes; every process returns the
/// same statistics (digests are filled in where this process can see whole tensors).
CaseResult run_case(const RunContext& ctx, const CaseSpec& spec);

/// BF16 RoPE output vs FP32 for the whole Q and K tensors (the report's drift.rope), shared
/// by every case of a run. Collective like run_case.
struct RopeDrift {
  DiffStats q;
  DiffStats k;
};
RopeDrift measure_rope_drift(const RunContext& ctx);

}  // namespace cpd
