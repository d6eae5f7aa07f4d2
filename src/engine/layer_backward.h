// The layer's backward (--scope layer --include-backward, docs/numerics.md §11): from the core's
// gradients of q, k, v to the layer input's gradient dX and every weight's gradient, each on its
// canonical order (cpdrift/layer_backward_math.h), for the case's candidate and the CP=1
// reference alike.
#pragma once

#include <string>
#include <vector>

#include "comm/collectives.h"
#include "comm/global_tensor.h"
#include "engine/backward.h"

namespace cpd {

/// One weight gradient (or dX) of the layer: this process's pieces of the candidate and the
/// reference, and how its pieces sit in the global tensor (`layout`, the candidate's data).
struct LayerGradient {
  std::string name;  // "dx", "q_proj", "q_bias", …, "o_proj", "q_norm", "k_norm"
  std::string shape;  // what the global tensor's axes are
  std::vector<FloatBuffer> candidate, reference;  // the hosted pieces, layout's order
  GlobalTensor layout;
};

/// The inputs of one hosted rank: the core's gradients (candidate and reference, the shapes of
/// RankGradients') and the forward's FP32 attention output (o_proj's dW reads it).
struct LayerBackwardInputs {
  const Shard* dq[2];
  const Shard* dk[2];
  const Shard* dv[2];
  const Shard* attention[2];
};

/// Every gradient of the layer for the hosted ranks (hosted_ranks order): dX on each CP rank's
/// token owner (TP rank 0) through the TP chain over the head groups; q/k/v_proj, their biases
/// and o_proj through the token chain of each TP rank's CP ranks (token_chain.h), held by the
/// chain's last CP rank; q_norm and k_norm folded on rank 0 from every (token block, head group)
/// partial. Collective over the run's processes.
std::vector<LayerGradient> run_layer_backward(const CaseGrid& grid,
                                              const std::vector<LayerBackwardInputs>& inputs,
                                              Transport& transport,
                                              const Collectives& collectives, InputStore& store);

}  // namespace cpd
