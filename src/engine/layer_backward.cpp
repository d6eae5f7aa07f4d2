#include "engine/layer_backward.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <stdexcept>

#include "engine/layer_backward_parts.h"
#include "engine/o_proj.h"
#include "engine/protocol_common.h"
#include "engine/tp_chain.h"
#include "kernels/attention_backend.h"
#include "kernels/input_store.h"
#include "kernels/layer_weights.h"

namespace cpd {
namespace {

using namespace layer_backward_parts;

// The TP rank holding query head h (KV head h with `kv`).
const LogicalRank& head_owner(const CaseGrid& grid, std::int64_t h, bool kv, int cp_rank) {
  for (int t = 0; t < grid.spec.tp; ++t) {
    const LogicalRank& r = grid.at(t, cp_rank);
    if ((kv ? r.kv_heads : r.q_heads).contains(h)) return r;
  }
  throw std::logic_error("layer backward: no TP rank holds the head");
}

// A gradient to be published: its global tensor, and the hosted pieces as they come, in order.
LayerGradient& add_gradient(std::vector<LayerGradient>& out, std::string name, std::string shape,
                            int batch, std::int64_t heads, std::int64_t seq, int width) {
  LayerGradient& g = out.emplace_back();
  g.name = std::move(name);
  g.shape = std::move(shape);
  g.layout.batch = batch;
  g.layout.heads = heads;
  g.layout.seq_len = seq;
  g.layout.width = width;
  return g;
}
// The next piece in global order; `candidate` and `reference` its rows where this process holds
// it (`piece.owner == here`).
void add_piece(LayerGradient& g, const GlobalPiece& piece, int here, const float* candidate,
               const float* reference) {
  const bool hosted = piece.owner == here;
  if (hosted) {
    g.hosted.push_back(LayerGradient::Hosted{
        candidate, reference, static_cast<std::size_t>(piece.tokens.size()) * g.layout.width});
  }
  g.layout.add(piece, hosted ? candidate : nullptr);
}

// dX on the token owners (TP rank 0), candidate and reference, and the candidate's TP-reduction
// lanes (Megatron's column-parallel backward: each TP rank's partial dX all-reduced or
// reduce-scattered over TP): per chunk, each TP rank's head groups (one chain over a group's q, k,
// v features each) folded in ascending group order into a plane [2 + TP][B][rows][hidden]
// travelling the TP ranks, each rank's own partial of the candidate in its plane 2 + tp_rank.
struct DxGrads {
  std::array<Shard, 2> dx;
  std::vector<Shard> tp_lanes;  // kTrainerTpLanes' order
};
std::map<std::size_t, DxGrads> dx_grads(const CaseGrid& grid,
                                        const std::vector<LogicalRank>& hosted,
                                        const std::vector<HeadGrads>& grads, Transport& transport,
                                        InputStore& store) {
  const Problem& p = grid.problem;
  const int d = p.dims.head_dim, hidden = p.dims.hidden_size, gs = p.dims.group_size();
  const LayerWeights& weights = *store.problem().weights;
  std::map<std::size_t, DxGrads> dx;  // hosted index of a token owner → its dX
  for (std::size_t i = 0; i < hosted.size(); ++i) {
    if (hosted[i].tp_rank != 0) continue;
    const ShardShape shape{p.batch, Range{0, 1}, hosted[i].tokens, hidden};
    DxGrads& g = dx[i];
    g.dx = {Shard(shape, Uninitialized{}), Shard(shape, Uninitialized{})};
    for (std::size_t k = 0; k < (p.reduction_lanes ? kTrainerTpLanes.size() : 0); ++k)
      g.tp_lanes.emplace_back(shape, Uninitialized{});
  }
  const int features = (gs + 2) * d;
  const TpChain chain = layer_chain(grid);
  run_tp_chain(
      grid, chain, transport, hosted,
      [&](std::size_t i, const Range& chunk, FloatBuffer z, bool continues) {
        const LogicalRank& r = hosted[i];
        const std::int64_t rows = chunk.size(), plane = rows * hidden;
        const std::int64_t n = 2 * p.batch * plane;
        const std::int64_t first = grads[i].q[0]->shape.local_row(chunk.begin);
        const bool apart = continues && p.o_proj_order == OProjOrder::rank_sums;
        if (!continues) {
          z.resize(static_cast<std::size_t>(chain.planes * p.batch * plane));
          mark_unwritten(z);
        }
        FloatBuffer own;
        FloatBuffer& into = apart ? own : z;
        if (apart) {
          own.resize(static_cast<std::size_t>(n));
          mark_unwritten(own);
        }
        float* lane = p.reduction_lanes ? z.data() + (2 + r.tp_rank) * p.batch * plane : nullptr;
        std::vector<std::vector<float>> xs;
        std::vector<FoldedProjectionJob> folds;
        for (int w = 0; w < 2; ++w) {
          for (int b = 0; b < p.batch; ++b) {
            FoldedProjectionJob fold{
                {}, into.data() + (w * p.batch + b) * plane, continues && !apart};
            for (std::int64_t g = r.kv_heads.begin; g < r.kv_heads.end; ++g) {
              std::vector<float>& x = xs.emplace_back(static_cast<std::size_t>(rows * features));
              for (std::int64_t t = 0; t < rows; ++t) {
                float* row = x.data() + t * features;
                for (int j = 0; j < gs + 2; ++j) {
                  const Shard& sh = j < gs    ? *grads[i].q[w]
                                    : j == gs ? *grads[i].k[w]
                                              : *grads[i].v[w];
                  const std::int64_t h = j < gs ? g * gs + j : g;
                  std::memcpy(row + j * d, sh.at(b, h, first + t),
                              static_cast<std::size_t>(d) * sizeof(float));
                }
              }
              fold.heads.push_back(ProjectionJob{x.data(), rows, weights.qkv_group_transposed(g),
                                                 features, nullptr});
            }
            // A rank that starts the plane folds its own partial there already; the others
            // again, from zero.
            if (lane != nullptr && w == 0 && continues)
              folds.push_back(FoldedProjectionJob{fold.heads, lane + b * plane});
            folds.push_back(std::move(fold));
          }
        }
        store.backend().project_folded(folds, features, hidden);
        if (lane != nullptr && !continues)
          std::memcpy(lane, z.data(), static_cast<std::size_t>(p.batch * plane) * sizeof(float));
        if (apart) {
          for (std::int64_t e = 0; e < n; ++e) z[static_cast<std::size_t>(e)] += own[e];
        }
        return z;
      },
      [&](std::size_t i, const Range& chunk, const FloatBuffer& z) {
        reduce_tp_lanes(grid, chunk, z, dx.at(i).tp_lanes);
        std::array<Shard, 2>& out = dx.at(i).dx;
        const std::int64_t rows = chunk.size(), first = out[0].shape.local_row(chunk.begin);
        for (int w = 0; w < 2; ++w) {
          for (int b = 0; b < p.batch; ++b) {
            std::memcpy(out[w].at(b, 0, first), z.data() + (w * p.batch + b) * rows * hidden,
                        static_cast<std::size_t>(rows * hidden) * sizeof(float));
          }
        }
      });
  return dx;
}

// A weight buffer's lane planes (after its candidate and reference, each `plane` floats).
std::vector<const float*> lane_rows(const FloatBuffer& buf, std::int64_t plane) {
  std::vector<const float*> rows;
  for (std::size_t k = 0; k < kGradientLanes.size(); ++k)
    rows.push_back(buf.data() + (2 + k) * plane);
  return rows;
}

// q_proj, k_proj, v_proj: [heads, D, hidden] (Hugging Face's [out][in], a head's rows a piece),
// their biases [heads, D, 1], and o_proj [Hq, hidden, D] (each query head's columns a piece),
// from the buffers the token chains' holder filled.
void publish_weights(const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
                     QkvGrads& qkv_grads, std::vector<std::vector<FloatBuffer>>& o_proj, int world,
                     int here, std::vector<LayerGradient>& out) {
  const ModelDims& dims = grid.problem.dims;
  const int d = dims.head_dim, hidden = dims.hidden_size;
  const bool bias = dims.qkv_bias;
  const std::int64_t qh = grid.ranks[0].q_heads.size(), kvh = grid.ranks[0].kv_heads.size();
  std::vector<std::vector<FloatBuffer>>& qkv = qkv_grads.weight;
  std::vector<std::vector<FloatBuffer>>& qkv_bias = qkv_grads.bias;
  const int holder = token_chain_holder(grid);
  const auto hosted_index = [&](const LogicalRank& r) -> std::ptrdiff_t {
    for (std::size_t i = 0; i < hosted.size(); ++i) {
      if (hosted[i].id == r.id) return static_cast<std::ptrdiff_t>(i);
    }
    return -1;
  };
  const char* names[3] = {"q", "k", "v"};
  for (int is_bias = 0; is_bias < (bias ? 2 : 1); ++is_bias) {
    for (int t = 0; t < 3; ++t) {
      const bool kv = t > 0;
      const std::int64_t heads = kv ? dims.num_kv_heads : dims.num_q_heads;
      const int width = is_bias ? 1 : hidden;
      LayerGradient& g = add_gradient(
          out, std::string(names[t]) + (is_bias ? "_bias" : "_proj"),
          is_bias ? "[heads, head_dim, 1]" : "[heads, head_dim, hidden]", 1, heads, d, width);
      if (grid.problem.reduction_lanes)
        g.lanes.assign(kGradientLanes.begin(), kGradientLanes.end());
      for (std::int64_t h = 0; h < heads; ++h) {
        const LogicalRank& owner = head_owner(grid, h, kv, holder);
        const float* rows[2] = {nullptr, nullptr};
        const std::ptrdiff_t i = hosted_index(owner);
        if (i >= 0) {
          const std::int64_t slot = t == 0   ? h - owner.q_heads.begin
                                    : t == 1 ? qh + h - owner.kv_heads.begin
                                             : qh + kvh + h - owner.kv_heads.begin;
          FloatBuffer& buf =
              (is_bias ? qkv_bias
                       : qkv)[static_cast<std::size_t>(i)][static_cast<std::size_t>(slot)];
          rows[0] = buf.data();
          rows[1] = buf.data() + d * width;
          if (!g.lanes.empty()) g.tp_lanes.push_back(lane_rows(buf, d * width));
          g.storage.push_back(std::move(buf));
        }
        add_piece(g, GlobalPiece{0, h, Range{0, d}, process_of(owner.id, world)}, here, rows[0],
                  rows[1]);
      }
    }
  }
  {  // o_proj: [Hq, hidden, D], each query head's columns [hidden][D] a piece
    LayerGradient& g =
        add_gradient(out, "o_proj", "[heads, hidden, head_dim] (o_proj's columns of each head)", 1,
                     dims.num_q_heads, hidden, d);
    if (grid.problem.reduction_lanes) g.lanes.assign(kGradientLanes.begin(), kGradientLanes.end());
    for (std::int64_t h = 0; h < dims.num_q_heads; ++h) {
      const LogicalRank& owner = head_owner(grid, h, false, holder);
      const float* rows[2] = {nullptr, nullptr};
      const std::ptrdiff_t i = hosted_index(owner);
      if (i >= 0) {
        FloatBuffer& buf =
            o_proj[static_cast<std::size_t>(i)][static_cast<std::size_t>(h - owner.q_heads.begin)];
        rows[0] = buf.data();
        rows[1] = buf.data() + std::int64_t{hidden} * d;
        if (!g.lanes.empty()) g.tp_lanes.push_back(lane_rows(buf, std::int64_t{hidden} * d));
        g.storage.push_back(std::move(buf));
      }
      add_piece(g, GlobalPiece{0, h, Range{0, hidden}, process_of(owner.id, world)}, here, rows[0],
                rows[1]);
    }
  }
}

}  // namespace

std::vector<LayerGradient> run_layer_backward(const CaseGrid& grid,
                                              const std::vector<LayerBackwardInputs>& inputs,
                                              Transport& transport, const Collectives& collectives,
                                              InputStore& store) {
  const Problem& p = grid.problem;
  const ModelDims& dims = p.dims;
  const int d = dims.head_dim, hidden = dims.hidden_size;
  const int world = transport.world_size(), here = transport.process_index();
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);

  std::vector<HeadGrads> grads = head_grads(grid, hosted, inputs, store);
  QkvGrads qkv_grads = qkv_weight_grads(grid, hosted, grads, transport, store);
  std::vector<std::vector<FloatBuffer>> o_proj =
      o_proj_weight_grads(grid, hosted, inputs, transport, store);
  std::map<std::size_t, DxGrads> dx = dx_grads(grid, hosted, grads, transport, store);
  std::vector<float> norms;
  if (dims.qk_norm) norms = fold_norm_partials(grid, hosted, grads, world, collectives);
  grads.clear();

  // The gradients in the report's order, each as its global tensor's pieces, pointing into the
  // buffers above (moved into the gradient's storage: nothing is copied).
  std::vector<LayerGradient> out;
  {
    LayerGradient& g = add_gradient(out, "dx", "[B, 1, S, hidden]", p.batch, 1, p.seq_len, hidden);
    if (p.reduction_lanes) g.lanes.assign(kTrainerTpLanes.begin(), kTrainerTpLanes.end());
    std::vector<std::pair<Range, int>> ranges;  // every token range and its CP rank, by position
    for (int c = 0; c < grid.spec.cp; ++c) {
      for (const Range& t : grid.at(0, c).tokens) ranges.emplace_back(t, c);
    }
    std::sort(ranges.begin(), ranges.end(),
              [](const auto& x, const auto& y) { return x.first.begin < y.first.begin; });
    for (int b = 0; b < p.batch; ++b) {
      for (const auto& [tokens, c] : ranges) {
        const LogicalRank& owner = grid.at(0, c);
        const float* rows[2] = {nullptr, nullptr};
        std::vector<const float*> lanes(g.lanes.size(), nullptr);
        for (auto& [i, grads_of] : dx) {
          if (hosted[i].id != owner.id) continue;
          const std::int64_t row = grads_of.dx[0].shape.local_row(tokens.begin);
          for (int w = 0; w < 2; ++w) rows[w] = grads_of.dx[w].at(b, 0, row);
          for (std::size_t k = 0; k < lanes.size(); ++k)
            lanes[k] = grads_of.tp_lanes[k].at(b, 0, row);
        }
        add_piece(g, GlobalPiece{b, 0, tokens, process_of(owner.id, world)}, here, rows[0],
                  rows[1]);
        if (rows[0] != nullptr && !lanes.empty()) g.tp_lanes.push_back(std::move(lanes));
      }
    }
    for (auto& [i, grads_of] : dx) {
      for (Shard& s : grads_of.dx) g.storage.push_back(std::move(s.data));
      for (Shard& s : grads_of.tp_lanes) g.storage.push_back(std::move(s.data));
    }
  }
  publish_weights(grid, hosted, qkv_grads, o_proj, world, here, out);
  if (dims.qk_norm) {  // q_norm, k_norm: [head_dim], folded on rank 0
    for (int t = 0; t < 2; ++t) {
      LayerGradient& g = add_gradient(out, t == 0 ? "q_norm" : "k_norm", "[head_dim]", 1, 1, 1, d);
      const float* rows[2] = {nullptr, nullptr};
      if (!norms.empty()) {
        FloatBuffer buf(static_cast<std::size_t>(2 * d));
        for (int w = 0; w < 2; ++w)
          std::memcpy(buf.data() + w * d, norms.data() + (w * 2 + t) * d,
                      static_cast<std::size_t>(d) * sizeof(float));
        rows[0] = buf.data();
        rows[1] = buf.data() + d;
        g.storage.push_back(std::move(buf));
      }
      add_piece(g, GlobalPiece{0, 0, Range{0, 1}, 0}, here, rows[0], rows[1]);
    }
  }
  return out;
}

}  // namespace cpd
