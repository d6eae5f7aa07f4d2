// The layer's o_proj (--scope layer, docs/numerics.md §11): the attention outputs' head groups
// projected onto the hidden dim and folded in ascending group order along each CP rank's TP
// ranks, the running sum passed from rank to rank a chunk of tokens at a time (layer_chain).
#pragma once

#include <vector>

#include "cpdrift/tp_lanes.h"
#include "engine/protocol.h"
#include "kernels/input_store.h"

namespace cpd {

/// The layer's output of the tokens one owner (TP rank 0 of a CP rank) holds:
/// [B][1][its tokens][hidden] each.
struct LayerOutputs {
  LogicalRank rank;
  Shard candidate, reference;
  /// The candidate's TP-reduction lanes (kTrainerTpLanes' order, numerics.md §12): the TP
  /// ranks' partials written in the model's dtype and summed as each stack's collective does.
  std::vector<Shard> tp_lanes;
};

/// The owner's TP-reduction lanes of a finished chunk of a layer chain (layer_chain: plane 2 + t
/// holds TP rank t's partial of the candidate) into `lanes` (kTrainerTpLanes' order, each shaped
/// as the owner's output): Megatron's buffer is the CP rank's [S_cp][B][hidden]
/// (sequence-major), so a token's row is its local row · B + b.
void reduce_tp_lanes(const CaseGrid& grid, const Range& chunk, const FloatBuffer& z,
                     std::vector<Shard>& lanes);

/// o_proj of `candidate` and `reference`, per hosted rank (hosted_ranks order) the attention
/// outputs of its heads, in the problem's o_proj_order. Collective.
std::vector<LayerOutputs> run_o_proj(const CaseGrid& grid,
                                     const std::vector<const AttnShard*>& candidate,
                                     const std::vector<const AttnShard*>& reference,
                                     Transport& transport, InputStore& store);

}  // namespace cpd
