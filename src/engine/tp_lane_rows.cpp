#include "engine/tp_lane_rows.h"

#include <algorithm>

#include "kernels/attention_backend.h"
#include "kernels/layer_weights.h"

namespace cpd {

std::vector<float> tp_lane_layer(const Problem& p, InputStore& store, const std::vector<float>& out,
                                 std::int64_t q, const TpCollective& tp, TpLane lane) {
  const ModelDims& d = p.dims;
  const int hidden = d.hidden_size, dim = d.head_dim, gs = d.group_size(), width = gs * dim;
  const int groups_per_rank = d.num_kv_heads / tp.ranks;
  const std::int64_t plane = q * hidden;
  // [rank][B][q][hidden]: each TP rank's partial, its groups folded from zero.
  std::vector<float> partial(static_cast<std::size_t>(tp.ranks * p.batch * plane));
  std::vector<std::vector<float>> group_rows;  // [q][G]: the group's heads side by side
  std::vector<FoldedProjectionJob> folds;
  for (int t = 0; t < tp.ranks; ++t) {
    for (int b = 0; b < p.batch; ++b) {
      folds.push_back(FoldedProjectionJob{{}, partial.data() + (t * p.batch + b) * plane, false});
      for (int g = t * groups_per_rank; g < (t + 1) * groups_per_rank; ++g) {
        std::vector<float>& x = group_rows.emplace_back(static_cast<std::size_t>(q * width));
        for (int j = 0; j < gs; ++j) {
          const float* head =
              out.data() + ((static_cast<std::size_t>(b) * d.num_q_heads + g * gs + j) * q) * dim;
          for (std::int64_t i = 0; i < q; ++i)
            std::copy_n(head + i * dim, dim, x.begin() + (i * gs + j) * dim);
        }
        folds.back().heads.push_back(
            ProjectionJob{x.data(), q, store.problem().weights->o_proj_group(g), width, nullptr});
      }
    }
  }
  store.backend().project_folded(folds, width, hidden);
  const WireType wire = p.dtype == DType::bf16 ? WireType::bf16 : WireType::fp32;
  std::vector<float> layer(static_cast<std::size_t>(p.batch * plane));
  float by_rank[kMaxLaneRanks];
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t i = 0; i < q; ++i) {
      const CollectiveRow at = tp.row_of(b, i);
      const TpBuffer buffer{at.rows * hidden, wire};
      for (int col = 0; col < hidden; ++col) {
        const std::int64_t e = b * plane + i * hidden + col;
        for (int t = 0; t < tp.ranks; ++t)
          by_rank[t] = partial[static_cast<std::size_t>(t * p.batch * plane + e)];
        layer[static_cast<std::size_t>(e)] =
            tp_lane_sum(lane, by_rank, tp.ranks, at.row * hidden + col, buffer);
      }
    }
  }
  return layer;
}

}  // namespace cpd
