// The layer's backward (--scope layer --include-backward, docs/numerics.md §11): from the core's
// gradients of q, k, v to the layer input's gradient dX and every weight's gradient, each on its
// canonical order (cpdrift/layer_backward_math.h), for the case's candidate and the CP=1
// reference alike.
#pragma once

#include <string>
#include <vector>

#include "comm/collectives.h"
#include "comm/global_tensor.h"
#include "cpdrift/tp_lanes.h"
#include "engine/backward.h"
#include "engine/token_chain.h"

namespace cpd {

/// One gradient of the layer (dX or a weight's): its global tensor (`layout`, the candidate's
/// pieces in global order) and the pieces this process holds, candidate and reference, pointing
/// into `storage`.
struct LayerGradient {
  std::string name;   // "dx", "q_proj", "q_bias", …, "o_proj", "q_norm", "k_norm"
  std::string shape;  // what the global tensor's axes are
  GlobalTensor layout;
  struct Hosted {
    const float* candidate;
    const float* reference;
    std::size_t count;
  };
  std::vector<Hosted> hosted;  // layout's order
  /// The reduction lanes of this gradient (numerics.md §12): dX's over TP (kTrainerTpLanes), the
  /// weights' over DP × CP (kGradientLanes); none for the norms'.
  std::vector<TpLane> lanes;
  /// Per hosted piece, the candidate through each of `lanes`.
  std::vector<std::vector<const float*>> tp_lanes;
  std::vector<FloatBuffer> storage;
};

/// The inputs of one hosted rank: the core's gradients (candidate and reference, the shapes of
/// RankGradients'; dq and dk are made over into the projections' output gradients in place) and
/// the forward's FP32 attention output (o_proj's dW reads it).
struct LayerBackwardInputs {
  Shard* dq[2];
  Shard* dk[2];
  const Shard* dv[2];
  const Shard* attention[2];
};

/// The token chains of the layer's weight gradients (token_chain.h), the same on every rank:
/// q/k/v_proj's [(its query heads + 2 · its KV heads)·D][hidden (+ 1, the bias)] and o_proj's
/// [hidden][its query heads·D] (each TP rank's shard; every TP rank's is the same shape). A chain
/// of several stages is cut into kPiecesPerStage pieces a stage (rows a multiple of 16), so the
/// stages overlap for all but about 1/kPiecesPerStage of it while the supersteps stay few; one
/// stage (CP = 1) takes one piece.
inline constexpr std::int64_t kPiecesPerStage = 8;
TokenChain layer_qkv_chain(const CaseGrid& grid);
TokenChain layer_o_chain(const CaseGrid& grid);

/// Every gradient of the layer for the hosted ranks (hosted_ranks order): dX on each CP rank's
/// token owner (TP rank 0) through the TP chain over the head groups; q/k/v_proj, their biases
/// and o_proj through the token chain of each TP rank's CP ranks (token_chain.h), held by the
/// chain's last CP rank; q_norm and k_norm folded on rank 0 from every (token block, head group)
/// partial. Collective over the run's processes.
std::vector<LayerGradient> run_layer_backward(const CaseGrid& grid,
                                              const std::vector<LayerBackwardInputs>& inputs,
                                              Transport& transport, const Collectives& collectives,
                                              InputStore& store);

}  // namespace cpd
