// `--weights PATH --layer N` (docs/inputs.md): layer N's attention weights read from a Hugging
// Face checkpoint — a directory holding model.safetensors.index.json and its shards, a
// directory holding model.safetensors, or one .safetensors file — by the model's tensor names:
// model.layers.N.self_attn.{q,k,v,o}_proj.weight, q_norm.weight and k_norm.weight where the
// model has them, {q,k,v}_proj.bias where it has a qkv bias. BF16, in transformers' [out][in]
// layout.
#pragma once

#include <memory>
#include <string>

#include "kernels/layer_weights.h"

namespace cpd {

/// Opens the checkpoint and checks every tensor the layer needs against `dims` (present, BF16,
/// the model's shape, within its file): anything else — a missing tensor or shard, another
/// dtype or shape, a layer the checkpoint lacks — is a UsageError naming the file and what is
/// wrong. The bytes are read on first use, a head's rows (a head group's columns of o_proj) at a
/// time, so a process reads only what its ranks' heads use.
std::shared_ptr<const LayerWeightSource> open_layer_checkpoint(const std::string& path, int layer,
                                                               const ModelDims& dims);

}  // namespace cpd
