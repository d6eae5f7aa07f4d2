// The layer's backward in parts (layer_backward.h runs them): the projections' output gradients
// and the norms' weights (layer_head_grads.cpp), the weight gradients' token chains
// (layer_weight_grads.cpp). Engine-internal.
#pragma once

#include <vector>

#include "cpdrift/tp_lanes.h"
#include "engine/layer_backward.h"

namespace cpd::layer_backward_parts {

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

/// dP of every hosted rank's heads in place of the core's dq and dk: RoPE's transpose, then the
/// head norm's backward from the recomputed pre-norm rows, with the norm partials.
std::vector<HeadGrads> head_grads(const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
                                  const std::vector<LayerBackwardInputs>& inputs,
                                  InputStore& store);

/// The ranks' norm partials on rank 0, folded in ascending (block, group) order, block-major:
/// [2 planes][q_norm, k_norm][D]. Empty elsewhere. Collective.
std::vector<float> fold_norm_partials(const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
                                      const std::vector<HeadGrads>& grads, int world,
                                      const Collectives& collectives);

/// The planes of a weight gradient's buffers on the holder: candidate, reference, then each of
/// kGradientLanes' (the DP × CP reduce-scatter of the CP ranks' partials, numerics.md §12) unless
/// --no-reduction-lanes.
inline int weight_planes(const CaseGrid& grid) {
  return 2 + (grid.problem.reduction_lanes ? static_cast<int>(kGradientLanes.size()) : 0);
}

/// q/k/v_proj's gradients and their biases through each TP rank's token chain, on the holder per
/// hosted rank and head slot (its query heads, then its KV heads' k, then v): the weight
/// [weight_planes][D][hidden] and the bias [weight_planes][D] (a model with one). Collective.
struct QkvGrads {
  std::vector<std::vector<FloatBuffer>> weight, bias;
};
QkvGrads qkv_weight_grads(const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
                          const std::vector<HeadGrads>& grads, Transport& transport,
                          InputStore& store);

/// o_proj's gradient through each TP rank's token chain, on the holder per hosted rank and query
/// head: its columns [weight_planes][hidden][D]. Collective.
std::vector<std::vector<FloatBuffer>> o_proj_weight_grads(
    const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
    const std::vector<LayerBackwardInputs>& inputs, Transport& transport, InputStore& store);

}  // namespace cpd::layer_backward_parts
