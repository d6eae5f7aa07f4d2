#include "engine/layer_backward.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "cpdrift/layer_backward_math.h"
#include "cpdrift/layer_math.h"
#include "cpdrift/rope.h"
#include "engine/protocol_common.h"
#include "engine/token_chain.h"
#include "engine/tp_chain.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/layer_inputs.h"
#include "kernels/input_store.h"
#include "kernels/layer_weights.h"

namespace cpd {
namespace {

// One hosted rank's gradients of the projections' outputs (dP: after the bias, before the norm),
// candidate and reference — the core's dq and dk made over in place, its dv as it is — and its
// norm weights' (token block, head group) partials.
struct HeadGrads {
  Shard* q[2] = {nullptr, nullptr};
  Shard* k[2] = {nullptr, nullptr};
  const Shard* v[2] = {nullptr, nullptr};
  // Per tensor (q_norm, k_norm) and plane: [its blocks][its groups][D], blocks in (b, position)
  // order.
  std::vector<float> norm_partials[2][2];
};

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
        for (int f = 0; f < half; ++f) rope_cos_sin(pos, inv_freq[f], cos_row[f], sin_row[f]);
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

// The ranks' (token block, head group) partials on rank 0, folded in ascending (block, group)
// order, block-major: [2 planes][q_norm, k_norm][D]. Empty elsewhere.
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


// Rows [B·T][width] of one hosted rank's tokens, (b, local row) order: the layer's input (with a
// column of ones after it when the model has a bias: its gradient is the token sum of dP) or its
// output's gradient.
std::vector<float> token_rows(const Problem& p, const LogicalRank& r, bool grad, int width,
                              ThreadPool& pool) {
  const std::int64_t rows = total_size(r.tokens);
  std::vector<float> x(static_cast<std::size_t>(p.batch * rows * width));
  std::vector<std::int64_t> positions;
  for (const Range& t : r.tokens) {
    for (std::int64_t pos = t.begin; pos < t.end; ++pos) positions.push_back(pos);
  }
  pool.parallel_for(p.batch * rows, [&](std::int64_t k) {
    const int b = static_cast<int>(k / rows);
    float* row = x.data() + k * width;
    (grad ? layer_grad_row : layer_hidden_row)(p, b, positions[static_cast<std::size_t>(k % rows)],
                                               row);
    if (width > p.dims.hidden_size) row[p.dims.hidden_size] = 1.0f;
  });
  return x;
}

// The token blocks of a stage's visits as TokenBlocks: dy at `dy(b, local row)`, x at row
// (b·T + local row) of `x`.
template <class DyAt>
std::vector<TokenBlock> stage_blocks(const CaseGrid& grid, const LogicalRank& r,
                                     const TokenStage& stage, const float* x, std::int64_t ld_x,
                                     const DyAt& dy) {
  const std::int64_t bt = layer_token_block(grid.problem.seq_len), rows = total_size(r.tokens);
  const ShardShape shape{grid.problem.batch, Range{0, 1}, r.tokens, 1};
  std::vector<TokenBlock> blocks;
  for (const auto& [b, tokens] : stage.visits) {
    for (std::int64_t pos = tokens.begin; pos < tokens.end; pos += bt) {
      const std::int64_t lr = shape.local_row(pos);
      blocks.push_back(TokenBlock{dy(b, lr), x + (b * rows + lr) * ld_x, bt});
    }
  }
  return blocks;
}

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

}  // namespace

namespace {

TokenChain layer_chain_of(const CaseGrid& grid, std::int64_t outputs, std::int64_t inputs) {
  const auto stages = static_cast<std::int64_t>(token_stages(grid).size());
  const std::int64_t pieces = stages == 1 ? 1 : kPiecesPerStage * stages;
  const std::int64_t rows = ((outputs + pieces - 1) / pieces + 15) / 16 * 16;
  return TokenChain{outputs, inputs, rows, grid.problem.o_proj_order == OProjOrder::rank_sums};
}

}  // namespace

TokenChain layer_qkv_chain(const CaseGrid& grid) {
  const ModelDims& d = grid.problem.dims;
  const LogicalRank& r = grid.ranks[0];
  return layer_chain_of(grid, (r.q_heads.size() + 2 * r.kv_heads.size()) * d.head_dim,
                        d.hidden_size + (d.qkv_bias ? 1 : 0));
}

TokenChain layer_o_chain(const CaseGrid& grid) {
  const ModelDims& d = grid.problem.dims;
  return layer_chain_of(grid, d.hidden_size, grid.ranks[0].q_heads.size() * d.head_dim);
}

std::vector<LayerGradient> run_layer_backward(const CaseGrid& grid,
                                              const std::vector<LayerBackwardInputs>& inputs,
                                              Transport& transport,
                                              const Collectives& collectives, InputStore& store) {
  const Problem& p = grid.problem;
  const ModelDims& dims = p.dims;
  const int d = dims.head_dim, hidden = dims.hidden_size, gs = dims.group_size();
  const int world = transport.world_size(), here = transport.process_index();
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const LayerWeights& weights = *store.problem().weights;
  const bool bias = dims.qkv_bias;

  // dP of every hosted rank's heads, in place of the core's gradients, and its norm partials.
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

  // q/k/v_proj and their biases: each TP rank's feature rows (its query heads' q rows, then its KV
  // heads' k and v rows) through its CP ranks' token chain, written on the holder straight into
  // each head slot's published buffers: the weight [2][D][hidden], the bias [2][D].
  std::vector<std::vector<FloatBuffer>> qkv(hosted.size()), qkv_bias(hosted.size());
  const std::int64_t qh = grid.ranks[0].q_heads.size(), kvh = grid.ranks[0].kv_heads.size();
  {
    const TokenChain chain = layer_qkv_chain(grid);
    const int width = static_cast<int>(chain.inputs);
    std::vector<std::vector<float>> x(hosted.size());
    for (std::size_t i = 0; i < hosted.size(); ++i)
      x[i] = token_rows(p, hosted[i], false, width, store.pool());
    run_token_chain(
        grid, chain, transport, hosted,
        [&](std::size_t i, const TokenStage& stage, const Range& piece, float* plane, bool first) {
          const LogicalRank& r = hosted[i];
          std::vector<TokenSumJob> jobs;
          for (std::int64_t o = piece.begin; o < piece.end;) {
            const std::int64_t slot = o / d, end = std::min(piece.end, (slot + 1) * d);
            for (int w = 0; w < 2; ++w) {
              const Shard* dp = slot < qh         ? grads[i].q[w]
                                : slot < qh + kvh ? grads[i].k[w]
                                                  : grads[i].v[w];
              const std::int64_t h = slot < qh         ? r.q_heads.begin + slot
                                     : slot < qh + kvh ? r.kv_heads.begin + slot - qh
                                                       : r.kv_heads.begin + slot - qh - kvh;
              TokenSumJob job;
              job.blocks = stage_blocks(grid, r, stage, x[i].data(), width,
                                        [&](int b, std::int64_t lr) { return dp->at(b, h, lr) + o % d; });
              job.ld_dy = d;
              job.ld_x = job.ld_sum = width;
              job.outputs = static_cast<int>(end - o);
              job.inputs = width;
              job.sum = plane + (w * piece.size() + (o - piece.begin)) * width;
              job.continues = !first;
              jobs.push_back(std::move(job));
            }
            o = end;
          }
          store.backend().token_sums(jobs);
        },
        [&](std::size_t i, const Range& piece, const FloatBuffer& plane) {
          if (qkv[i].empty()) {
            qkv[i].resize(static_cast<std::size_t>(qh + 2 * kvh));
            qkv_bias[i].resize(qkv[i].size());
          }
          for (std::int64_t o = piece.begin; o < piece.end; ++o) {
            const auto slot = static_cast<std::size_t>(o / d);
            FloatBuffer &wb = qkv[i][slot], &bb = qkv_bias[i][slot];
            if (wb.empty()) wb.resize(static_cast<std::size_t>(2 * d * hidden));
            if (bias && bb.empty()) bb.resize(static_cast<std::size_t>(2 * d));
            for (int w = 0; w < 2; ++w) {
              const float* row = plane.data() + (w * piece.size() + o - piece.begin) * width;
              std::memcpy(wb.data() + (w * d + o % d) * hidden, row,
                          static_cast<std::size_t>(hidden) * sizeof(float));
              if (bias) bb[static_cast<std::size_t>(w * d + o % d)] = row[hidden];
            }
          }
        });
  }

  // o_proj: each TP rank's columns (its query heads') through its CP ranks' token chain, the
  // output's gradient dY against the forward's attention output; on the holder each head's
  // columns go to their published buffer [2][hidden][D].
  std::vector<std::vector<FloatBuffer>> o_proj(hosted.size());
  {
    std::vector<std::vector<float>> dy(hosted.size());
    for (std::size_t i = 0; i < hosted.size(); ++i)
      dy[i] = token_rows(p, hosted[i], true, hidden, store.pool());
    const TokenChain chain = layer_o_chain(grid);
    const std::int64_t columns = chain.inputs;
    run_token_chain(
        grid, chain, transport, hosted,
        [&](std::size_t i, const TokenStage& stage, const Range& piece, float* plane, bool first) {
          const LogicalRank& r = hosted[i];
          std::vector<TokenSumJob> jobs;
          for (int w = 0; w < 2; ++w) {
            for (std::int64_t h = r.q_heads.begin; h < r.q_heads.end; ++h) {
              const Shard& a = *inputs[i].attention[w];
              // x: the attention rows of head h; dy: the output gradient's rows, at the piece.
              std::vector<TokenBlock> blocks = stage_blocks(
                  grid, r, stage, dy[i].data(), hidden,
                  [&](int b, std::int64_t lr) { return a.at(b, h, lr); });
              for (TokenBlock& blk : blocks) {
                std::swap(blk.dy, blk.x);
                blk.dy += piece.begin;
              }
              TokenSumJob job;
              job.blocks = std::move(blocks);
              job.ld_dy = hidden;
              job.ld_x = d;
              job.ld_sum = columns;
              job.outputs = static_cast<int>(piece.size());
              job.inputs = d;
              job.sum = plane + w * piece.size() * columns + (h - r.q_heads.begin) * d;
              job.continues = !first;
              jobs.push_back(std::move(job));
            }
          }
          store.backend().token_sums(jobs);
        },
        [&](std::size_t i, const Range& piece, const FloatBuffer& plane) {
          if (o_proj[i].empty()) o_proj[i].resize(static_cast<std::size_t>(qh));
          for (std::int64_t lh = 0; lh < qh; ++lh) {
            FloatBuffer& hb = o_proj[i][static_cast<std::size_t>(lh)];
            if (hb.empty()) hb.resize(static_cast<std::size_t>(2 * hidden * d));
            for (int w = 0; w < 2; ++w) {
              for (std::int64_t o = piece.begin; o < piece.end; ++o) {
                std::memcpy(hb.data() + (w * hidden + o) * d,
                            plane.data() + (w * piece.size() + o - piece.begin) * columns + lh * d,
                            static_cast<std::size_t>(d) * sizeof(float));
              }
            }
          }
        });
  }

  // dX: per chunk, each TP rank's head groups (one chain over a group's q, k, v features each)
  // folded in ascending group order into a plane [2][B][rows][hidden] travelling the TP ranks.
  std::map<std::size_t, std::array<Shard, 2>> dx;  // hosted index of a token owner → its dX
  for (std::size_t i = 0; i < hosted.size(); ++i) {
    if (hosted[i].tp_rank != 0) continue;
    const ShardShape shape{p.batch, Range{0, 1}, hosted[i].tokens, hidden};
    dx[i] = {Shard(shape, Uninitialized{}), Shard(shape, Uninitialized{})};
  }
  const int features = (gs + 2) * d;
  run_tp_chain(
      grid, layer_chain(grid), transport, hosted,
      [&](std::size_t i, const Range& chunk, FloatBuffer z, bool continues) {
        const LogicalRank& r = hosted[i];
        const std::int64_t rows = chunk.size(), plane = rows * hidden;
        const std::int64_t n = 2 * p.batch * plane;
        const std::int64_t first = grads[i].q[0]->shape.local_row(chunk.begin);
        const bool apart = continues && p.o_proj_order == OProjOrder::rank_sums;
        FloatBuffer own;
        FloatBuffer& into = apart ? own : z;
        if (!continues || apart) {
          into.resize(static_cast<std::size_t>(n));
          mark_unwritten(into);
        }
        std::vector<std::vector<float>> xs;
        std::vector<FoldedProjectionJob> folds;
        for (int w = 0; w < 2; ++w) {
          for (int b = 0; b < p.batch; ++b) {
            FoldedProjectionJob fold{{}, into.data() + (w * p.batch + b) * plane,
                                     continues && !apart};
            for (std::int64_t g = r.kv_heads.begin; g < r.kv_heads.end; ++g) {
              std::vector<float>& x = xs.emplace_back(static_cast<std::size_t>(rows * features));
              for (std::int64_t t = 0; t < rows; ++t) {
                float* row = x.data() + t * features;
                for (int j = 0; j < gs + 2; ++j) {
                  const Shard& sh = j < gs ? *grads[i].q[w] : j == gs ? *grads[i].k[w] : *grads[i].v[w];
                  const std::int64_t h = j < gs ? g * gs + j : g;
                  std::memcpy(row + j * d, sh.at(b, h, first + t),
                              static_cast<std::size_t>(d) * sizeof(float));
                }
              }
              fold.heads.push_back(ProjectionJob{x.data(), rows, weights.qkv_group_transposed(g),
                                                 features, nullptr});
            }
            folds.push_back(std::move(fold));
          }
        }
        store.backend().project_folded(folds, features, hidden);
        if (apart) {
          for (std::int64_t e = 0; e < n; ++e) z[static_cast<std::size_t>(e)] += own[e];
        }
        return z;
      },
      [&](std::size_t i, const Range& chunk, const FloatBuffer& z) {
        std::array<Shard, 2>& out = dx.at(i);
        const std::int64_t rows = chunk.size(), first = out[0].shape.local_row(chunk.begin);
        for (int w = 0; w < 2; ++w) {
          for (int b = 0; b < p.batch; ++b) {
            std::memcpy(out[w].at(b, 0, first), z.data() + (w * p.batch + b) * rows * hidden,
                        static_cast<std::size_t>(rows * hidden) * sizeof(float));
          }
        }
      });

  std::vector<float> norms;
  if (dims.qk_norm) norms = fold_norm_partials(grid, hosted, grads, world, collectives);
  grads.clear();

  // The gradients in the report's order, each as its global tensor's pieces, pointing into the
  // buffers above (moved into the gradient's storage: nothing is copied).
  std::vector<LayerGradient> out;
  {
    LayerGradient& g = add_gradient(out, "dx", "[B, 1, S, hidden]", p.batch, 1, p.seq_len, hidden);
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
        for (auto& [i, shards] : dx) {
          if (hosted[i].id != owner.id) continue;
          for (int w = 0; w < 2; ++w)
            rows[w] = shards[w].at(b, 0, shards[w].shape.local_row(tokens.begin));
        }
        add_piece(g, GlobalPiece{b, 0, tokens, process_of(owner.id, world)}, here, rows[0],
                  rows[1]);
      }
    }
    for (auto& [i, shards] : dx) {
      for (Shard& s : shards) g.storage.push_back(std::move(s.data));
    }
  }
  const int holder = token_chain_holder(grid);
  const auto hosted_index = [&](const LogicalRank& r) -> std::ptrdiff_t {
    for (std::size_t i = 0; i < hosted.size(); ++i) {
      if (hosted[i].id == r.id) return static_cast<std::ptrdiff_t>(i);
    }
    return -1;
  };
  // q_proj, k_proj, v_proj: [heads, D, hidden] (Hugging Face's [out][in], a head's rows a piece);
  // their biases [heads, D, 1].
  const char* names[3] = {"q", "k", "v"};
  for (int is_bias = 0; is_bias < (bias ? 2 : 1); ++is_bias) {
    for (int t = 0; t < 3; ++t) {
      const bool kv = t > 0;
      const std::int64_t heads = kv ? dims.num_kv_heads : dims.num_q_heads;
      const int width = is_bias ? 1 : hidden;
      LayerGradient& g =
          add_gradient(out, std::string(names[t]) + (is_bias ? "_bias" : "_proj"),
                       is_bias ? "[heads, head_dim, 1]" : "[heads, head_dim, hidden]", 1, heads,
                       d, width);
      for (std::int64_t h = 0; h < heads; ++h) {
        const LogicalRank& owner = head_owner(grid, h, kv, holder);
        const float* rows[2] = {nullptr, nullptr};
        const std::ptrdiff_t i = hosted_index(owner);
        if (i >= 0) {
          const std::int64_t slot = t == 0   ? h - owner.q_heads.begin
                                    : t == 1 ? qh + h - owner.kv_heads.begin
                                             : qh + kvh + h - owner.kv_heads.begin;
          FloatBuffer& buf = (is_bias ? qkv_bias : qkv)[static_cast<std::size_t>(i)]
                                                        [static_cast<std::size_t>(slot)];
          rows[0] = buf.data();
          rows[1] = buf.data() + d * width;
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
    for (std::int64_t h = 0; h < dims.num_q_heads; ++h) {
      const LogicalRank& owner = head_owner(grid, h, false, holder);
      const float* rows[2] = {nullptr, nullptr};
      const std::ptrdiff_t i = hosted_index(owner);
      if (i >= 0) {
        FloatBuffer& buf =
            o_proj[static_cast<std::size_t>(i)][static_cast<std::size_t>(h - owner.q_heads.begin)];
        rows[0] = buf.data();
        rows[1] = buf.data() + std::int64_t{hidden} * d;
        g.storage.push_back(std::move(buf));
      }
      add_piece(g, GlobalPiece{0, h, Range{0, hidden}, process_of(owner.id, world)}, here, rows[0],
                rows[1]);
    }
  }
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
