// CP protocols (design §4): how the logical ranks of a case move query rows, K/V and partial
// states so that every query owner ends with its rows merged over all KV blocks in global
// block order. Every protocol yields the same partial states, so the same bits.
#pragma once

#include <optional>
#include <vector>

#include "comm/transport.h"
#include "core/shard.h"
#include "core/util/thread_pool.h"
#include "cpdrift/attention_math.h"
#include "engine/manifest.h"
#include "kernels/input_store.h"

namespace cpd {

/// Which kernel computes a path's partial states.
enum class BlockKernel : std::uint8_t {
  canonical,  // the backend's attention kernel (numerics.md; on CUDA, bf16 is the tensor-core one)
  cublas_unfused,  // cuBLAS GEMMs + a softmax kernel (GPU backends only)
};

/// One arithmetic path (design §3): the inputs it reads, what its kernel does with P, and which
/// kernel runs it.
struct PathSpec {
  InputPrecision inputs = InputPrecision::fp32;
  ProbRounding rounding = ProbRounding::none;
  BlockKernel kernel = BlockKernel::canonical;
  friend bool operator==(const PathSpec&, const PathSpec&) = default;
};

/// What the checks of the ordered merge found on a rank's rows (design §3), round by round, on
/// the states the rank received: the rows merged again from the reverse of their arrival order
/// (the merge sorts by block index, so this must equal `merged` bit for bit: the report's
/// merge_order_probe), and |production FP32 fold − FP64 oracle| per element (merge_checks.h).
struct MergeChecks {
  AttnShard probe;                     // layout of the rank's query shard
  FloatBuffer oracle_out, oracle_lse;  // layouts of merged.out and merged.lse
};

/// A path's result on one logical rank hosted by this process.
struct RankOutput {
  LogicalRank rank;
  AttnShard merged;  // FP32 values, layout of the rank's query shard
  /// With checks: the merge checks, and the headers of every partial state merged as validated
  /// against the manifest (round order, manifest order within a round): the record of what ran.
  std::optional<MergeChecks> checks;
  std::vector<MessageHeader> merged_states;
  /// With lanes: the same states merged as each production stack does (numerics.md §10), one
  /// per kProductionLanes in its order, the layout of `merged` (out BF16-exact, lse FP32).
  std::vector<AttnShard> lanes;
};

/// What a protocol run computes besides the merged rows.
struct MergeExtras {
  bool checks = false;  // the merge checks (RankOutput::checks)
  bool lanes = false;   // the production lanes (RankOutput::lanes)
};

/// Runs `grid.spec.protocol` for one path over the logical ranks this process hosts
/// (process_of(id, W) == transport.process_index()), in grid.rounds() rounds: round i
/// computes, exchanges and merges the states of the i-th row group of every query range, so
/// states never accumulate beyond one round; `extras`: what else it computes. Collective over
/// the transport's processes. Throws ProtocolError when a message contradicts the manifest.
std::vector<RankOutput> run_protocol(const CaseGrid& grid, const PathSpec& path,
                                     Transport& transport, InputStore& inputs, MergeExtras extras);

/// The logical ranks of `grid` that this process hosts.
std::vector<LogicalRank> hosted_ranks(const CaseGrid& grid, const Transport& transport);

/// Shape of a rank's query shard (width head_dim) and of its lse (width 1).
ShardShape query_shape(const CaseGrid& grid, const LogicalRank& rank, int width);

}  // namespace cpd
