// The attention layer's weights and hidden states (--scope layer, docs/numerics.md §11):
// synthetic from the seed, generated a head (or a head group) at a time on first use and kept
// for the run, so a process holds only what its ranks' heads read.
//
// The distribution, and why: a trained checkpoint's BF16 weights and a BF16 model's hidden
// states hold BF16 values, so every value is generated in FP32 and rounded to BF16 once, and
// the FP32 and BF16 paths start from the same numbers. The hidden states (the decoder layer's
// input RMSNorm output, weight ≈ 1) are standard normals: RMS 1 per token. q_proj, k_proj,
// v_proj and o_proj are N(0, 1/in) (in: the reduction dim), so each projection's output has
// unit variance, the scale the core's generated q, k, v have and its gates are set for. With a
// bias (Qwen2's), q_proj, k_proj and v_proj are N(0, 1/(2·in)) and the bias N(0, 1/2): half the
// variance a per-channel mean and the total one, as the core's biased inputs (input_shape.h's
// kBiasNorm). q_norm and k_norm's weights are 1 + N(0, 1)/8, a trained norm's spread around one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/input_source.h"
#include "core/model.h"

namespace cpd {

/// Where a layer's weights come from: each block LayerWeights keeps, filled on first use.
class LayerWeightSource {
 public:
  virtual ~LayerWeightSource() = default;
  /// Block `index` of `tensor` in LayerWeights' layout (its accessors say it): q_proj, k_proj,
  /// v_proj head rows [D][hidden]; o_proj group columns [hidden][G]; q_bias, k_bias, v_bias a
  /// head's [D]; q_norm, k_norm [D] (index 0). Only asked for what the model has.
  virtual void fill(TensorId tensor, std::int64_t index, float* out) const = 0;
  /// What the report says of them: "synthetic", or the checkpoint and layer.
  virtual std::string describe() const = 0;
};

class LayerWeights {
 public:
  /// The synthetic weights of `dims`' attention layer from `seed`.
  LayerWeights(const ModelDims& dims, std::uint64_t seed);
  /// `dims`' weights from `source` (a checkpoint's layer: inputs/layer_checkpoint.h).
  LayerWeights(const ModelDims& dims, std::shared_ptr<const LayerWeightSource> source);

  /// Head `head`'s head_dim output rows of q_proj, k_proj or v_proj (tensor q, k or v), in Hugging
  /// Face's [out][in] layout: [head_dim][hidden].
  const float* projection(TensorId tensor, std::int64_t head) const;
  /// Head `head`'s bias [head_dim] of q, k or v; nullptr for a model without one.
  const float* bias(TensorId tensor, std::int64_t head) const;
  /// q_norm's (tensor q) or k_norm's (tensor k) weight [head_dim]; nullptr for a model without.
  const float* norm(TensorId tensor) const;
  /// o_proj's columns of KV head group `group` ((Hq / Hkv)·head_dim of them, the group's query
  /// heads in order): [hidden][group columns].
  const float* o_proj_group(std::int64_t group) const;
  /// o_proj_group transposed, [group columns][hidden]: the backward's dA reads a column's
  /// hidden outputs in order (layer_backward_math.h).
  const float* o_proj_group_transposed(std::int64_t group) const;
  /// q_proj, k_proj and v_proj's rows of KV head group `group` (its query heads' q rows, then its
  /// k rows, then its v rows) transposed, [hidden][(Hq / Hkv + 2)·head_dim]: dX's chain over the
  /// group's features.
  const float* qkv_group_transposed(std::int64_t group) const;
  /// Where the weights come from: "synthetic", or the checkpoint and layer.
  std::string source() const { return source_->describe(); }

 private:
  // A block derived from others (a transpose), kept under `key` (never a TensorId's).
  const float* kept(int key, std::int64_t index,
                    const std::function<std::vector<float>()>& make) const;
  const float* block(TensorId tensor, std::int64_t index) const;

  ModelDims dims_;
  std::shared_ptr<const LayerWeightSource> source_;
  mutable std::mutex mutex_;
  mutable std::map<std::pair<int, std::int64_t>, std::vector<float>> blocks_;
};

/// `problem` with its layer weights made, when it is a layer problem without them.
Problem with_layer_weights(Problem problem);

/// The layer's input of sequence `b` at position `pos`: hidden_size BF16-valued floats. Inside
/// the shared prompt every sequence's are sequence 0's (input_sequence), so their q, k and v are.
/// From a file (--inputs, problem.inputs), the stored values widened exactly to FP32.
void layer_hidden_row(const Problem& problem, int b, std::int64_t pos, float* row);
/// Rows `tokens` of sequence `b` ([tokens.size()][hidden_size]): layer_hidden_row's, a file's
/// read at once.
void layer_hidden_rows(const Problem& problem, int b, Range tokens, float* rows);

/// The RoPE position of token `pos` of sequence `b`: the input file's, else pos.
inline std::int64_t layer_rope_position(const Problem& problem, int b, std::int64_t pos) {
  return problem.inputs ? problem.inputs->rope_position(b, pos) : pos;
}

/// The gradient of the layer's output at (b, pos), where the backward starts: hidden_size
/// BF16-valued standard normals (a BF16 model's gradients are BF16), never shared between
/// sequences (as the core's dO).
void layer_grad_row(const Problem& problem, int b, std::int64_t pos, float* row);

}  // namespace cpd
