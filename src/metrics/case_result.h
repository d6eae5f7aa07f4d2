// The figures of a run: every case's drift statistics, measured from what the engine computed
// (engine/case_outputs.h), with the record of what ran.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/case_outputs.h"
#include "engine/paged/paged_case.h"
#include "metrics/diff_stats.h"
#include "metrics/rl_metrics.h"

namespace cpd {

class ThreadPool;

/// Drift of one candidate attention output against its reference.
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
  /// The te_p2p lane's backward (--include-lane-backward): its BF16 gradients vs the FP32
  /// reference and vs the canonical gradients' BF16 write.
  struct Lane {
    DiffStats dq, dk, dv;
    DiffStats canonical_dq, canonical_dk, canonical_dv;
  };
  bool available = false;
  DiffStats dq, dk, dv;
  DiffStats bf16_dq, bf16_dk, bf16_dv;  // the gradients' BF16 final write vs the FP32 reference
  std::vector<PerRank> per_rank;
  std::optional<Lane> te_p2p;
};

/// The dlogp leg (report `dlogp`): target-token logprobs of the BF16 CP output vs the FP32
/// CP=1 output cast to BF16, through the synthetic lm_head.
struct DlogpDrift {
  bool available = false;
  int vocab_size = 0;
  DiffStats drift;  // over the active tokens
  RlMetrics rl;     // the same tokens in the figures RL frameworks log (rank 0)
};

/// A TP-reduction lane of the layer (report `layer.tp_lanes`, numerics.md §12).
struct TpLaneDrift {
  TpLane lane;
  std::string tensor;      // "out" or "dx"
  DiffStats vs_reference;  // vs the reference's layer output (the digest: the lane's bits)
  DiffStats vs_canonical;  // vs the canonical layer output: mismatch_count, the bits that differ
};

/// The layer (--scope layer, report `layer`): the layer's output from the case's attention output
/// vs from the FP32 CP=1 reference cast alike, through the same o_proj.
struct LayerDrift {
  bool available = false;
  DiffStats out;
  std::vector<TpLaneDrift> tp_lanes;  // kTrainerTpLanes' order (paged: kRolloutTpLanes')
  /// With the backward: each gradient of the layer (dx, q_proj, …, q_norm, k_norm) from the
  /// case's core gradients vs from the CP=1 reference backward's, the same arithmetic.
  std::vector<std::pair<std::string, DiffStats>> backward;
};

/// A production lane of a case (report `production_lanes`).
struct LaneDrift {
  ProductionLane lane;
  OutLseStats vs_reference;  // vs the FP32 CP=1 reference
  OutLseStats vs_canonical;  // vs the canonical merge of the same BF16-kernel states
};

struct CaseResult {
  CaseSpec spec;  // as requested
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
  BackwardDrift backward;
  LayerDrift layer;
  DlogpDrift dlogp;
  /// GPU runs: the cuBLAS unfused path's drift, and the FP32 path on the GPU vs on the CPU
  /// (must be bitwise equal: the canonical order is the same on both).
  std::optional<OutLseStats> cublas_unfused;
  std::optional<OutLseStats> cuda_vs_cpu_fp32;
  std::vector<LaneDrift> lanes;  // the production lanes, kProductionLanes' order
  CaseExecution executed;  // what ran: backend, transport, processes, the blocks merged, bytes
  double seconds = 0.0;    // the case from its first kernel to its last figure
};

/// BF16 RoPE output vs FP32 for the whole Q and K tensors (the report's drift.rope).
struct RopeDrift {
  DiffStats q;
  DiffStats k;
};

/// One bitwise invariance of a paged case.
struct Invariance {
  std::string name;
  std::string compares;
  bool applicable = true;
  std::string reason;
  OutLseStats stats;

  bool bitwise_equal() const { return stats.out.bitwise_equal() && stats.lse.bitwise_equal(); }
};

struct PagedCaseResult : PagedCaseFacts {
  std::vector<std::string> coverage_errors;
  OutLseStats candidate;  // the rollout lane as written vs FP32 arithmetic on the same inputs
  OutLseStats fp32;       // the FP32 lane vs the FP32 reference: split and merge alone
  DiffStats dlogp;        // target-token logprobs of the candidate vs the reference cast alike
  RlMetrics dlogp_rl;     // the same tokens in the RL frameworks' figures
  std::optional<DiffStats> layer;           // --scope layer: the layer's output, the same two
  std::vector<TpLaneDrift> layer_tp_lanes;  // --scope layer: kRolloutTpLanes' order
  std::vector<Invariance> invariances;
  double seconds = 0.0;
};

/// The figures of what the engine computed: every comparison's statistics (collective: every
/// process calls these alike), with at rank 0 the digest of each comparison's candidate
/// (`digests[i]` belongs to the outputs' tensors[i]; "" elsewhere and for tensors not digested).
/// A prefill case is measured part by part into `into`, then finished with its record.
void measure_case_part(const CasePart& part, std::span<const std::string> digests,
                       const Collectives& collectives, ThreadPool& pool, CaseResult& into);
void finish_case(const CaseRecord& record, CaseResult& into);
PagedCaseResult measure_paged_case(const PagedCaseOutputs& outputs,
                                   std::span<const std::string> digests,
                                   const Collectives& collectives, ThreadPool& pool);
RopeDrift measure_rope(const RopeOutputs& outputs, std::span<const std::string> digests,
                       const Collectives& collectives, ThreadPool& pool);

}  // namespace cpd
