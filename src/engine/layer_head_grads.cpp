#include <algorithm>
#include <cstring>
#include <map>

#include "cpdrift/layer_backward_math.h"
#include "cpdrift/layer_math.h"
#include "cpdrift/rope.h"
#include "engine/layer_backward_parts.h"
#include "engine/protocol_common.h"
#include "kernels/cpu/layer_inputs.h"
#include "kernels/input_store.h"
#include "kernels/layer_weights.h"

namespace cpd::layer_backward_parts {
namespace {

// The rank's token blocks: (b, first position), in (b, position) order.
std::vector<std::pair<int, std::int64_t>> blocks_of(const CaseGrid& grid, const LogicalRank& r) {
  const std::int64_t bt = layer_token_block(grid.problem.seq_len);
  std::vector<std::pair<int, std::int64_t>> out;
  for (int b = 0; b < grid.problem.batch; ++b) {
    for (const Range& t : r.tokens) {
      for (std::int64_t p = t.begin; p < t.end; p += bt) out.emplace_back(b, p);
    }
  }
  return out;
}

// dP of q (query heads) or k (KV heads) from the core's gradient, in place: RoPE's transpose, then
// the head norm's backward from the pre-norm rows, each (token block, head group) a task that
// also makes the norm weight's partial of its block and group.
void norm_rope_backward(const CaseGrid& grid, const LogicalRank& r, TensorId tensor, Shard* out[2],
                        std::vector<float> partials[2], InputStore& store) {
  const Problem& p = grid.problem;
  const ModelDims& dims = p.dims;
  const int d = dims.head_dim, half = dims.rotary_dim / 2;
  const bool query = tensor == TensorId::q;
  const std::int64_t per_group = query ? dims.group_size() : 1;
  const Range heads = query ? r.q_heads : r.kv_heads;
  const std::int64_t groups = heads.size() / per_group;
  const float* norm = store.problem().weights->norm(tensor);
  const auto eps = static_cast<float>(dims.rms_norm_eps);
  const std::vector<float> inv_freq = rope_inv_freq(dims);
  const ShardShape shape{p.batch, heads, r.tokens, d};
  Shard pre;
  if (norm != nullptr) pre = layer_pre_norm(store.problem(), tensor, shape, store.pool());
  const std::vector<std::pair<int, std::int64_t>> blocks = blocks_of(grid, r);
  const std::int64_t bt = layer_token_block(p.seq_len);
  for (int w = 0; w < 2; ++w) {
    if (norm != nullptr)
      partials[w].assign(static_cast<std::size_t>(blocks.size() * groups * d), 0.0f);
  }
  const auto tasks = static_cast<std::int64_t>(2 * blocks.size() * groups);
  store.pool().parallel_for(tasks, [&](std::int64_t task) {
    const int w = static_cast<int>(task / (tasks / 2));
    const std::int64_t rest = task % (tasks / 2), g = rest % groups;
    const auto [b, first] = blocks[static_cast<std::size_t>(rest / groups)];
    std::vector<float> cos_row(static_cast<std::size_t>(half)), sin_row(cos_row.size());
    std::vector<float> xhat(static_cast<std::size_t>(d)), dnormed(xhat.size());
    float* partial = norm != nullptr ? partials[w].data() + rest * d : nullptr;
    for (std::int64_t pos = first; pos < first + bt; ++pos) {
      const std::int64_t row = shape.local_row(pos);
      if (p.rope) {
        const std::int64_t at = layer_rope_position(p, b, pos);
        for (int f = 0; f < half; ++f) rope_cos_sin(at, inv_freq[f], cos_row[f], sin_row[f]);
      }
      for (std::int64_t j = 0; j < per_group; ++j) {
        const std::int64_t h = heads.begin + g * per_group + j;
        float* dy = out[w]->at(b, h, row);
        if (p.rope) rope_unrotate_row(dy, cos_row.data(), sin_row.data(), half);
        if (norm == nullptr) continue;
        std::memcpy(dnormed.data(), dy, static_cast<std::size_t>(d) * sizeof(float));
        head_rms_norm_backward(pre.at(b, h, row), norm, dnormed.data(), d, eps, dy, xhat.data());
        norm_weight_accumulate(dnormed.data(), xhat.data(), 1, d, partial);
      }
    }
  });
}

}  // namespace

std::vector<HeadGrads> head_grads(const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
                                  const std::vector<LayerBackwardInputs>& inputs,
                                  InputStore& store) {
  std::vector<HeadGrads> grads(hosted.size());
  for (std::size_t i = 0; i < hosted.size(); ++i) {
    const LayerBackwardInputs& in = inputs[i];
    HeadGrads& g = grads[i];
    for (int w = 0; w < 2; ++w) {
      g.q[w] = in.dq[w];
      g.k[w] = in.dk[w];
      g.v[w] = in.dv[w];
    }
    norm_rope_backward(grid, hosted[i], TensorId::q, g.q, g.norm_partials[0], store);
    norm_rope_backward(grid, hosted[i], TensorId::k, g.k, g.norm_partials[1], store);
  }
  return grads;
}

std::vector<float> fold_norm_partials(const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
                                      const std::vector<HeadGrads>& grads, int world,
                                      const Collectives& collectives) {
  const Problem& p = grid.problem;
  const int d = p.dims.head_dim;
  const std::int64_t blocks_per_seq = p.seq_len / layer_token_block(p.seq_len);
  std::vector<StreamSegment> segments;
  for (const LogicalRank& r : grid.ranks) {
    const auto here = std::find_if(hosted.begin(), hosted.end(),
                                   [&](const LogicalRank& h) { return h.id == r.id; });
    for (int w = 0; w < 2; ++w) {
      for (int t = 0; t < 2; ++t) {
        const std::size_t floats = blocks_of(grid, r).size() * r.kv_heads.size() * d;
        const float* data = nullptr;
        if (here != hosted.end())
          data = grads[static_cast<std::size_t>(here - hosted.begin())].norm_partials[t][w].data();
        segments.push_back(StreamSegment{process_of(r.id, world), data, floats});
      }
    }
  }
  // (plane, tensor, global block, group) → its partial, on rank 0.
  std::map<std::tuple<int, int, std::int64_t, std::int64_t>, std::vector<float>> partials;
  collectives.stream_to_root(segments, [&](std::size_t i, const float* data) {
    const LogicalRank& r = grid.ranks[i / 4];
    const int w = static_cast<int>(i / 2 % 2), t = static_cast<int>(i % 2);
    std::size_t k = 0;
    for (const auto& [b, first] : blocks_of(grid, r)) {
      const std::int64_t block = b * blocks_per_seq + first / layer_token_block(p.seq_len);
      for (std::int64_t g = r.kv_heads.begin; g < r.kv_heads.end; ++g, ++k)
        partials[{w, t, block, g}].assign(data + k * d, data + (k + 1) * d);
    }
  });
  std::vector<float> folded;
  if (!collectives.root()) return folded;
  folded.resize(static_cast<std::size_t>(4 * d));
  for (int w = 0; w < 2; ++w) {
    for (int t = 0; t < 2; ++t) {
      float* into = folded.data() + (w * 2 + t) * d;
      bool first = true;
      for (const auto& [key, part] : partials) {  // the map's order: (block, group) ascending
        if (std::get<0>(key) != w || std::get<1>(key) != t) continue;
        fold_token_block(part.data(), d, first, into);
        first = false;
      }
    }
  }
  return folded;
}

}  // namespace cpd::layer_backward_parts
