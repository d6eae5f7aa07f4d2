#include <algorithm>
#include <cstring>

#include "cpdrift/layer_math.h"
#include "engine/layer_backward_parts.h"
#include "engine/protocol_common.h"
#include "kernels/attention_backend.h"
#include "kernels/input_store.h"
#include "kernels/layer_weights.h"

namespace cpd {
namespace {

TokenChain layer_chain_of(const CaseGrid& grid, std::int64_t outputs, std::int64_t inputs) {
  const auto stages = static_cast<std::int64_t>(token_stages(grid).size());
  const std::int64_t pieces = stages == 1 ? 1 : kPiecesPerStage * stages;
  const std::int64_t rows = ((outputs + pieces - 1) / pieces + 15) / 16 * 16;
  return TokenChain{outputs, inputs, rows, grid.problem.o_proj_order == OProjOrder::rank_sums,
                    grid.problem.reduction_lanes ? 2 + grid.spec.cp : 2};
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

namespace layer_backward_parts {
namespace {

// `n` consecutive elements of a weight gradient through gradient lane `lane`: each CP rank's
// partial of element j at own[c · stride + j] (the chain's planes 2 + c), the buffer's element
// index of the first `first` of `count` (this TP rank's weight, its own buffer).
void reduce_gradient_lanes(const CaseGrid& grid, TpLane lane, const float* own, std::int64_t stride,
                           std::int64_t n, std::int64_t first, std::int64_t count, float* out) {
  const int cp = grid.spec.cp;
  float partials[kMaxLaneRanks];
  for (std::int64_t j = 0; j < n; ++j) {
    for (int c = 0; c < cp; ++c) partials[c] = own[c * stride + j];
    out[j] = tp_lane_sum(lane, partials, cp, first + j, TpBuffer{count, WireType::fp32});
  }
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

}  // namespace

QkvGrads qkv_weight_grads(const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
                          const std::vector<HeadGrads>& grads, Transport& transport,
                          InputStore& store) {
  const Problem& p = grid.problem;
  const int d = p.dims.head_dim, hidden = p.dims.hidden_size;
  const bool bias = p.dims.qkv_bias;
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
        [&](std::size_t i, const TokenStage& stage, const Range& piece, float* plane, bool first,
            float* own, bool own_continues) {
          const LogicalRank& r = hosted[i];
          std::vector<TokenSumJob> jobs;
          for (std::int64_t o = piece.begin; o < piece.end;) {
            const std::int64_t slot = o / d, end = std::min(piece.end, (slot + 1) * d);
            for (int w = 0; w < (own != nullptr ? 3 : 2); ++w) {  // and the candidate's own partial
              const int of = w == 2 ? 0 : w;
              const Shard* dp = slot < qh         ? grads[i].q[of]
                                : slot < qh + kvh ? grads[i].k[of]
                                                  : grads[i].v[of];
              const std::int64_t h = slot < qh         ? r.q_heads.begin + slot
                                     : slot < qh + kvh ? r.kv_heads.begin + slot - qh
                                                       : r.kv_heads.begin + slot - qh - kvh;
              TokenSumJob job;
              job.blocks =
                  stage_blocks(grid, r, stage, x[i].data(), width,
                               [&](int b, std::int64_t lr) { return dp->at(b, h, lr) + o % d; });
              job.ld_dy = d;
              job.ld_x = job.ld_sum = width;
              job.outputs = static_cast<int>(end - o);
              job.inputs = width;
              job.sum = w == 2 ? own + (o - piece.begin) * width
                               : plane + (w * piece.size() + (o - piece.begin)) * width;
              job.continues = w == 2 ? own_continues : !first;
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
            const int planes = weight_planes(grid);
            if (wb.empty()) wb.resize(static_cast<std::size_t>(planes * d * hidden));
            if (bias && bb.empty()) bb.resize(static_cast<std::size_t>(planes * d));
            for (int w = 0; w < 2; ++w) {
              const float* row = plane.data() + (w * piece.size() + o - piece.begin) * width;
              std::memcpy(wb.data() + (w * d + o % d) * hidden, row,
                          static_cast<std::size_t>(hidden) * sizeof(float));
              if (bias) bb[static_cast<std::size_t>(w * d + o % d)] = row[hidden];
            }
            // The gradient lanes: this TP rank's weight [outputs][hidden] and bias [outputs],
            // each its own buffer of the reduce-scatter.
            const float* own = plane.data() + (2 * piece.size() + o - piece.begin) * width;
            const std::int64_t own_plane = piece.size() * width;
            for (int k = 0; k < planes - 2; ++k) {
              float* lane = wb.data() + ((2 + k) * d + o % d) * hidden;
              reduce_gradient_lanes(grid, kGradientLanes[k], own, own_plane, hidden, o * hidden,
                                    chain.outputs * hidden, lane);
              if (bias) {
                reduce_gradient_lanes(grid, kGradientLanes[k], own + hidden, own_plane, 1, o,
                                      chain.outputs, &bb[(2 + k) * d + o % d]);
              }
            }
          }
        });
  }
  return QkvGrads{std::move(qkv), std::move(qkv_bias)};
}

std::vector<std::vector<FloatBuffer>> o_proj_weight_grads(
    const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
    const std::vector<LayerBackwardInputs>& inputs, Transport& transport, InputStore& store) {
  const Problem& p = grid.problem;
  const int d = p.dims.head_dim, hidden = p.dims.hidden_size;
  const std::int64_t qh = grid.ranks[0].q_heads.size();
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
        [&](std::size_t i, const TokenStage& stage, const Range& piece, float* plane, bool first,
            float* own, bool own_continues) {
          const LogicalRank& r = hosted[i];
          std::vector<TokenSumJob> jobs;
          for (int w = 0; w < (own != nullptr ? 3 : 2); ++w) {  // and the candidate's own partial
            for (std::int64_t h = r.q_heads.begin; h < r.q_heads.end; ++h) {
              const Shard& a = *inputs[i].attention[w == 2 ? 0 : w];
              // x: the attention rows of head h; dy: the output gradient's rows, at the piece.
              std::vector<TokenBlock> blocks =
                  stage_blocks(grid, r, stage, dy[i].data(), hidden,
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
              job.sum =
                  (w == 2 ? own : plane + w * piece.size() * columns) + (h - r.q_heads.begin) * d;
              job.continues = w == 2 ? own_continues : !first;
              jobs.push_back(std::move(job));
            }
          }
          store.backend().token_sums(jobs);
        },
        [&](std::size_t i, const Range& piece, const FloatBuffer& plane) {
          if (o_proj[i].empty()) o_proj[i].resize(static_cast<std::size_t>(qh));
          for (std::int64_t lh = 0; lh < qh; ++lh) {
            FloatBuffer& hb = o_proj[i][static_cast<std::size_t>(lh)];
            if (hb.empty()) hb.resize(static_cast<std::size_t>(weight_planes(grid) * hidden * d));
            for (int w = 0; w < 2; ++w) {
              for (std::int64_t o = piece.begin; o < piece.end; ++o) {
                std::memcpy(hb.data() + (w * hidden + o) * d,
                            plane.data() + (w * piece.size() + o - piece.begin) * columns + lh * d,
                            static_cast<std::size_t>(d) * sizeof(float));
              }
            }
            // The gradient lanes: this TP rank's o_proj weight [hidden][columns] one buffer.
            for (std::int64_t o = piece.begin; o < piece.end && chain.planes > 2; ++o) {
              const float* own =
                  plane.data() + (2 * piece.size() + o - piece.begin) * columns + lh * d;
              for (std::size_t k = 0; k < kGradientLanes.size(); ++k) {
                reduce_gradient_lanes(grid, kGradientLanes[k], own, piece.size() * columns, d,
                                      o * columns + lh * d, hidden * columns,
                                      hb.data() + ((2 + k) * hidden + o) * d);
              }
            }
          }
        });
  }
  return o_proj;
}

}  // namespace layer_backward_parts
}  // namespace cpd
