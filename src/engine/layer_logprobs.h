// The layer's logprobs (--scope layer with --include-dlogp): the synthetic lm_head over the
// layer's output, sharded by vocabulary across the TP ranks (manifest.h's vocab_shard), each
// token's whole row of logits at its owner, where the log-softmax runs in vocabulary order.
#pragma once

#include <vector>

#include "engine/dlogp.h"
#include "engine/o_proj.h"

namespace cpd {

/// The logprobs of the tokens each hosted owner holds, from `layer`: the owners' layer outputs
/// (run_o_proj's, in the run's dtype as written). Each TP rank projects the chunk's rows onto its
/// vocabulary range; the owner gathers the ranges into whole rows and takes the logprobs and KL
/// exactly as the core's dlogp does (chunk_logprobs), so the bits are those of TP = 1. Collective.
std::vector<TokenLogprobs> run_layer_dlogp(const CaseGrid& grid,
                                           const std::vector<LayerOutputs>& layer, int vocab,
                                           Transport& transport, InputStore& store);

}  // namespace cpd
