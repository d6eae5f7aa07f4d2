// What one prefill/chunked case computed on this process, part by part: every comparison its
// report makes, every tensor it publishes, and the record of what ran. The metrics, dump and report
// layers read it (engine/case_sink.h); the engine never sees a statistic.
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "comm/transport.h"
#include "core/plan.h"
#include "cpdrift/production_lanes.h"
#include "cpdrift/tp_lanes.h"
#include "engine/comparison.h"

namespace cpd {

/// Owns the tensors that comparisons and published tensors point into; nothing it holds ever
/// moves.
class HeldTensors {
 public:
  const Shard& keep(Shard s) { return shards_.emplace_back(std::move(s)); }
  const AttnShard& keep(AttnShard a) { return attention_.emplace_back(std::move(a)); }
  const std::vector<float>& keep(std::vector<float> v) {
    return values_.emplace_back(std::move(v));
  }

 private:
  std::deque<Shard> shards_;
  std::deque<AttnShard> attention_;
  std::deque<std::vector<float>> values_;
};

/// A KV block whose partial states a query owner merged, as the states' headers described it
/// (the manifest checked every header before the merge).
struct ExecutedBlock {
  int index = 0;
  Range range;
  int owner_cp_rank = 0;
  friend bool operator==(const ExecutedBlock&, const ExecutedBlock&) = default;
};

/// What a case's run actually did (docs/style.md: every "actual" field of the report is written
/// from this, never from the request). The same on every process, but for `started`.
struct CaseExecution {
  std::string backend;    // the compute backend that ran the kernels: "cpu", "cuda"
  std::string transport;  // what moved the messages: "inprocess", "mpi", "nccl", "cuda_ipc"
  int processes_used = 1;
  /// Per TP rank, every KV block whose states that TP rank's query owners merged on the FP32
  /// path, ascending by index: the split plan as executed.
  std::vector<std::vector<ExecutedBlock>> merged_blocks;
  /// Per TP rank, every KV block whose partial dq the query owners folded (the backward leg).
  std::vector<std::vector<ExecutedBlock>> backward_blocks;
  /// Per CP query owner (TP rank 0), the global block indices it merged.
  std::vector<std::vector<int>> merged_block_indices;
  std::vector<Range> block_bounds;                // the KV block grid that ran, ascending
  std::vector<std::vector<Range>> query_tokens;   // per CP rank, its query shard
  TransportCounters moved;                        // messages and bytes of the case, all processes
  std::chrono::steady_clock::time_point started;  // this process's clock
};

/// The te_p2p lane's gradients (BF16) against the FP32 CP=1 reference and against the
/// canonical gradients' BF16 write.
struct LaneBackwardComparisons {
  Comparison dq, dk, dv;
  Comparison canonical_dq, canonical_dk, canonical_dv;
};

/// The backward leg: the FP32 gradients vs the CP=1 reference, and their BF16 final write.
struct BackwardComparisons {
  Comparison dq, dk, dv;
  Comparison bf16_dq, bf16_dk, bf16_dv;
  std::optional<LaneBackwardComparisons> te_p2p;  // --include-lane-backward
};

/// One active token of a logprob comparison: where it is and its two logprobs (the train side,
/// the case's candidate; the rollout side, its reference).
struct TokenPair {
  int sequence = 0;
  std::int64_t position = 0;
  int cp_rank = 0;  // the CP rank that owns it
  /// The two logprobs: FP32 values from cpdrift's own legs (exact in double), FP64 as read by
  /// `cpdrift compare`.
  double train = 0, rollout = 0;
  double kl = 0;  // KL(π_rollout ‖ π_train) over the whole vocabulary at this token
  /// Tokens to the nearest boundary between CP shards and between KV blocks (the split): 0 for
  /// the two tokens either side of one; -1 when the case has none.
  std::int64_t shard_distance = -1, split_distance = -1;
};

/// Tokens from `pos` to the nearest boundary, each given in `edges` (ascending) as the first
/// position after it: 0 for the two tokens either side of one; -1 when there is none.
inline std::int64_t boundary_distance(const std::vector<std::int64_t>& edges, std::int64_t pos) {
  const auto after = std::upper_bound(edges.begin(), edges.end(), pos);
  std::int64_t best = -1;
  if (after != edges.end()) best = *after - 1 - pos;
  if (after != edges.begin()) {
    const std::int64_t d = pos - *(after - 1);
    if (best < 0 || d < best) best = d;
  }
  return best;
}

/// A production lane of a case (numerics.md §10): the stack's merge of the BF16-kernel path's
/// states vs the FP32 CP=1 reference, and vs the canonical merge of the same states.
struct LaneComparisons {
  ProductionLane lane;
  OutLseComparison vs_reference, vs_canonical;
};

/// A TP-reduction lane of the layer (numerics.md §12): the stack's sum of the TP ranks' o_proj
/// partials vs the reference's layer output, and vs the canonical layer output.
struct TpLaneComparisons {
  TpLane lane;
  std::string tensor;  // "out" (o_proj's all-reduce) or "dx" (the column-parallel backward's)
  Comparison vs_reference, vs_canonical;
};

/// A part of a prefill case that is complete: the comparisons it makes and the tensors it
/// publishes. The engine hands a case's parts to the sink as they complete and frees each once
/// the sink returns, so no more than one part's tensors are alive beyond what later parts need.
/// A comparison that is set is the whole of it (every process sets the same ones).
struct CasePart {
  explicit CasePart(int cp_ranks_that_ran) : cp_ranks(cp_ranks_that_ran) {}
  CasePart(const CasePart&) = delete;
  CasePart& operator=(const CasePart&) = delete;

  int cp_ranks = 1;                 // CP ranks of the grid that ran (the per-rank figures)
  std::vector<CaseTensor> tensors;  // in publication order; candidate_tensor indexes these
  std::optional<OutLseComparison> cp_merge_fp32;  // FP32 CP/chunked vs FP32 CP=1 prefill
  std::optional<OutLseComparison> dtype_path;     // problem dtype inputs + final write vs reference
  std::optional<OutLseComparison> bf16_kernel;    // emulated BF16 flash kernel vs FP32 reference
  std::optional<OutLseComparison> topology;  // FP32 candidate vs FP32 CP=1, same split and layout
  std::optional<OutLseComparison> merge_probe;     // reversed arrival order vs canonical: exactly 0
  std::optional<OutLseComparison> merge_oracle;    // FP32 fold vs FP64 oracle, same states (diffs)
  std::optional<OutLseComparison> cublas_unfused;  // GPU backends
  std::optional<OutLseComparison> cuda_vs_cpu_fp32;  // GPU runs: the FP32 path again on the CPU
  std::vector<LaneComparisons> lanes;  // the production lanes, kProductionLanes' order
  std::optional<BackwardComparisons> backward;
  std::optional<Comparison> layer;  // the layer's output (--scope layer) vs the reference's
  /// With layer: kTrainerTpLanes' order, the output's; with its backward, dX's after them.
  std::vector<TpLaneComparisons> tp_lanes;
  /// --scope layer --include-backward: each gradient of the layer (dx, q_proj, …) vs the one the
  /// CP=1 reference backward's gradients give, in the report's order.
  std::vector<std::pair<std::string, Comparison>> layer_backward;
  std::optional<Comparison> dlogp;  // target-token logprobs over the active tokens
  /// With dlogp, on rank 0 only: every active token's pair in (sequence, position) order (the
  /// RL metrics' input; one float pair a token).
  std::vector<TokenPair> dlogp_tokens;
  HeldTensors held;
};

/// What a prefill case was and did, handed to the sink after its last part.
struct CaseRecord {
  CaseSpec spec;  // as requested
  std::string name;
  int vocab_size = 0;              // the dlogp leg's, when it ran
  bool topology_required = false;  // the block grids are equal, so the bits must be
  std::string topology_reference;  // the CP=1 counterpart's case name
  CaseExecution executed;
};

/// BF16 RoPE output vs FP32 for the whole Q and K tensors (the report's drift.rope), shared by
/// every case of a run.
struct RopeOutputs {
  RopeOutputs() = default;
  RopeOutputs(const RopeOutputs&) = delete;
  RopeOutputs& operator=(const RopeOutputs&) = delete;

  Comparison q, k;                  // each with its cast tensor as the candidate
  std::vector<CaseTensor> tensors;  // digests only
  HeldTensors held;
};

}  // namespace cpd
