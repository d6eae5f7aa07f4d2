// CP protocols (design §4): how the logical ranks of a case move query rows, K/V and partial
// states so that every query owner ends with its rows merged over all KV blocks in global
// block order. Every protocol yields the same partial states, so the same bits.
#pragma once

#include <vector>

#include "cpdrift/backend/input_store.h"
#include "cpdrift/comm/transport.h"
#include "cpdrift/core/shard.h"
#include "cpdrift/engine/manifest.h"
#include "cpdrift/numerics/attention_math.h"
#include "cpdrift/util/thread_pool.h"

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

/// A path's result on one logical rank hosted by this process.
struct RankOutput {
  LogicalRank rank;
  AttnShard merged;  // FP32 values, layout of the rank's query shard
  /// The validated partial states in manifest order, and the order they arrived in; kept
  /// only when requested (the merge-order probe and the merge oracle read them).
  std::vector<Message> states;
  std::vector<std::size_t> arrival_order;
};

/// Runs `grid.spec.protocol` for one path over the logical ranks this process hosts
/// (process_of(id, W) == transport.process_index()). Collective over the transport's
/// processes. Throws ProtocolError when a message contradicts the manifest.
std::vector<RankOutput> run_protocol(const CaseGrid& grid, const PathSpec& path,
                                     Transport& transport, InputStore& inputs, bool keep_states);

/// The logical ranks of `grid` that this process hosts.
std::vector<LogicalRank> hosted_ranks(const CaseGrid& grid, const Transport& transport);

/// Shape of a rank's query shard (width head_dim) and of its lse (width 1).
ShardShape query_shape(const CaseGrid& grid, const LogicalRank& rank, int width);

}  // namespace cpd
