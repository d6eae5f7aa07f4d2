#include "engine/o_proj.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "engine/protocol_common.h"
#include "engine/tp_chain.h"
#include "kernels/attention_backend.h"
#include "kernels/layer_weights.h"

namespace cpd {
namespace {

// Group g's attention rows of `tokens` (one of the rank's ranges), [rows][G]: each token's
// group heads side by side, in head order (the columns of o_proj the group reads).
std::vector<float> group_rows(const AttnShard& a, int b, std::int64_t group, const Range& tokens,
                              const ModelDims& dims) {
  const int d = dims.head_dim, gs = dims.group_size();
  const std::int64_t rows = tokens.size(), first = a.out.shape.local_row(tokens.begin);
  std::vector<float> x(static_cast<std::size_t>(rows * gs * d));
  for (int j = 0; j < gs; ++j) {
    const float* head = a.out.at(b, group * gs + j, first);
    for (std::int64_t r = 0; r < rows; ++r) {
      std::memcpy(x.data() + (r * gs + j) * d, head + r * d,
                  static_cast<std::size_t>(d) * sizeof(float));
    }
  }
  return x;
}

// Rank r's step on a chunk: its head groups' partials folded in ascending order into z
// ([2 + TP][B][rows][hidden]: candidate, reference, then each TP rank's own partial of the
// candidate), started or continued; its own partial into its plane 2 + tp_rank. Under
// rank_sums, a continuing rank folds its own groups from zero and adds the sum to the plane it
// received.
FloatBuffer fold_own_groups(const CaseGrid& grid, const LogicalRank& r, const Range& tokens,
                            const AttnShard& cand, const AttnShard& ref, OProjOrder order,
                            InputStore& store, FloatBuffer z, bool continues) {
  const ModelDims& dims = grid.problem.dims;
  const int batch = grid.problem.batch, hidden = dims.hidden_size;
  const int width = dims.group_size() * dims.head_dim;
  const std::int64_t plane = tokens.size() * hidden, n = 2 * batch * plane;
  const bool apart = continues && order == OProjOrder::rank_sums;
  if (!continues) {
    z.resize(static_cast<std::size_t>(layer_chain(grid).planes * batch * plane));
    mark_unwritten(z);
  }
  FloatBuffer own;
  FloatBuffer& into = apart ? own : z;
  if (apart) {
    own.resize(static_cast<std::size_t>(n));
    mark_unwritten(own);
  }
  const bool lanes = grid.problem.reduction_lanes;
  float* lane = lanes ? z.data() + (2 + r.tp_rank) * batch * plane : nullptr;  // its partial
  const LayerWeights& weights = *store.problem().weights;
  const Range groups{r.q_heads.begin / dims.group_size(), r.q_heads.end / dims.group_size()};
  std::vector<std::vector<float>> rows;  // kept while the jobs read them
  std::vector<FoldedProjectionJob> folds;
  for (int which = 0; which < 2; ++which) {
    for (int b = 0; b < batch; ++b) {
      FoldedProjectionJob fold{{}, into.data() + (which * batch + b) * plane, continues && !apart};
      for (std::int64_t g = groups.begin; g < groups.end; ++g) {
        rows.push_back(group_rows(which == 0 ? cand : ref, b, g, tokens, dims));
        fold.heads.push_back(ProjectionJob{rows.back().data(), tokens.size(),
                                           weights.o_proj_group(g), width, nullptr});
      }
      // A rank that starts the plane folds its own partial there already; the others again.
      if (lanes && which == 0 && continues)
        folds.push_back(FoldedProjectionJob{fold.heads, lane + b * plane});
      folds.push_back(std::move(fold));
    }
  }
  store.backend().project_folded(folds, width, hidden);
  if (lanes && !continues)
    std::memcpy(lane, z.data(), static_cast<std::size_t>(batch * plane) * sizeof(float));
  if (apart) {
    for (std::int64_t e = 0; e < n; ++e) z[static_cast<std::size_t>(e)] += own[e];
  }
  return z;
}

}  // namespace

void reduce_tp_lanes(const CaseGrid& grid, const Range& chunk, const FloatBuffer& z,
                     std::vector<Shard>& lanes) {
  if (lanes.empty()) return;  // --no-reduction-lanes
  const Problem& p = grid.problem;
  const int tp = grid.spec.tp, batch = p.batch, hidden = p.dims.hidden_size;
  const std::int64_t rows = chunk.size(), plane = rows * hidden;
  const std::int64_t first = lanes.front().shape.local_row(chunk.begin);
  const TpBuffer buffer{lanes.front().shape.rows() * batch * hidden,
                        p.dtype == DType::bf16 ? WireType::bf16 : WireType::fp32};
  float partials[kMaxLaneRanks];
  for (std::size_t k = 0; k < kTrainerTpLanes.size(); ++k) {
    Shard& s = lanes[k];
    for (int b = 0; b < batch; ++b) {
      for (std::int64_t row = 0; row < rows; ++row) {
        float* dst = s.at(b, 0, first + row);
        const std::int64_t base = ((first + row) * batch + b) * hidden;
        for (int col = 0; col < hidden; ++col) {
          const std::int64_t e = b * plane + row * hidden + col;
          for (int t = 0; t < tp; ++t)
            partials[t] = z[static_cast<std::size_t>((2 + t) * batch * plane + e)];
          dst[col] = tp_lane_sum(kTrainerTpLanes[k], partials, tp, base + col, buffer);
        }
      }
    }
  }
}

std::vector<LayerOutputs> run_o_proj(const CaseGrid& grid,
                                     const std::vector<const AttnShard*>& candidate,
                                     const std::vector<const AttnShard*>& reference,
                                     Transport& transport, InputStore& store) {
  const Problem& p = grid.problem;
  const int hidden = p.dims.hidden_size;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  std::vector<LayerOutputs> result;
  std::map<std::size_t, std::size_t> owned;  // hosted index of a token owner -> its result
  for (std::size_t i = 0; i < hosted.size(); ++i) {
    const LogicalRank& r = hosted[i];
    if (r.tp_rank != 0) continue;
    const ShardShape shape{p.batch, Range{0, 1}, r.tokens, hidden};
    owned[i] = result.size();
    result.push_back(
        LayerOutputs{r, Shard(shape, Uninitialized{}), Shard(shape, Uninitialized{}), {}});
    for (std::size_t k = 0; k < (p.reduction_lanes ? kTrainerTpLanes.size() : 0); ++k)
      result.back().tp_lanes.emplace_back(shape, Uninitialized{});
  }
  run_tp_chain(
      grid, layer_chain(grid), transport, hosted,
      [&](std::size_t i, const Range& chunk, FloatBuffer z, bool continues) {
        return fold_own_groups(grid, hosted[i], chunk, *candidate[i], *reference[i], p.o_proj_order,
                               store, std::move(z), continues);
      },
      [&](std::size_t i, const Range& chunk, const FloatBuffer& z) {
        LayerOutputs& out = result[owned.at(i)];
        const std::int64_t rows = chunk.size(), first = out.candidate.shape.local_row(chunk.begin);
        for (int which = 0; which < 2; ++which) {
          Shard& s = which == 0 ? out.candidate : out.reference;
          for (int b = 0; b < p.batch; ++b) {
            std::memcpy(s.at(b, 0, first), z.data() + (which * p.batch + b) * rows * hidden,
                        static_cast<std::size_t>(rows * hidden) * sizeof(float));
          }
        }
        reduce_tp_lanes(grid, chunk, z, out.tp_lanes);
      });
  return result;
}

}  // namespace cpd
