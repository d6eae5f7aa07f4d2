// Test support: digests of a protocol's merged outputs as global tensors, and the small
// problem the invariance tests share.
#pragma once

#include <string>
#include <vector>

#include "engine/protocol.h"
#include "engine/tensor_layout.h"
#include "metrics/digest.h"

namespace cpd::testing {

/// The default model's problem in `dtype` (for a case's name).
inline Problem problem_in(DType dtype) {
  Problem p;
  p.dtype = dtype;
  return p;
}

struct Digests {
  std::string out, lse;
};

/// Collective over `coll`; the digests are valid on its rank 0.
inline Digests digests_of(const CaseGrid& grid, const std::vector<RankOutput>& outs,
                          const Collectives& coll, int world, int me) {
  std::vector<const Shard*> o, l;
  for (const RankOutput& r : outs) {
    o.push_back(&r.merged.out);
    l.push_back(&r.merged.lse);
  }
  return Digests{stream_digest(coll, global_tensor(grid, world, me, grid.problem.dims.head_dim, o),
                               DigestFormat::fp32),
                 stream_digest(coll, global_tensor(grid, world, me, 1, l), DigestFormat::fp32)};
}

/// S = 64, B = 1, Qwen3 heads: small enough for every topology, long enough for splits of 4.
inline Problem small_problem() {
  Problem p;
  p.seq_len = 64;
  return p;
}

/// A small attention layer (--scope layer) with every piece: qk norms, a qkv bias, GQA groups of
/// two (TP 1, 2, 4 valid), hidden 96, head_dim 64 (the CPU tile's smallest); B = 2, S = 32.
inline Problem small_layer() {
  Problem p;
  p.dims.name = "test-layer";
  p.dims.hidden_size = 96;
  p.dims.num_q_heads = 8;
  p.dims.num_kv_heads = 4;
  p.dims.head_dim = 64;
  p.dims.rotary_dim = 64;
  p.dims.qk_norm = true;
  p.dims.qkv_bias = true;
  p.batch = 2;
  p.seq_len = 32;
  p.layer = true;
  return p;
}

/// `part`'s shape for `t`: the KV heads 1 and 2 for k and v (a KV head has fewer heads than
/// `part`'s query heads), `part` itself for q and dO.
inline ShardShape layer_tensor_shape(TensorId t, const ShardShape& part) {
  return t == TensorId::k || t == TensorId::v
             ? ShardShape{part.batch, Range{1, 3}, part.tokens, part.width}
             : part;
}

inline constexpr PathSpec kFp32{InputPrecision::fp32, ProbRounding::none};
inline constexpr PathSpec kBf16Kernel{InputPrecision::bf16, ProbRounding::bf16};

}  // namespace cpd::testing
