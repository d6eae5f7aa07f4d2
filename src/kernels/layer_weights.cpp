#include "kernels/layer_weights.h"

#include <cmath>
#include <stdexcept>

#include "cpdrift/bf16.h"
#include "cpdrift/input_shape.h"
#include "kernels/cpu/normals.h"

namespace cpd {
namespace {

// n normals of `tensor` from element `first` on (both multiples of 4: whole Philox blocks), each
// as round_bf16(offset + scale·z).
void bf16_normals(std::uint64_t seed, TensorId tensor, std::uint64_t first, std::int64_t n,
                  float scale, float offset, float* out) {
  normal_blocks(seed, tensor, first >> 2, n / 4, out);
  for (std::int64_t i = 0; i < n; ++i) out[i] = round_bf16(offset + scale * out[i]);
}

float inverse_sqrt(std::int64_t n) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
}

// The synthetic weights (layer_weights.h says which distribution and why).
class SyntheticWeights final : public LayerWeightSource {
 public:
  SyntheticWeights(const ModelDims& dims, std::uint64_t seed) : dims_(dims), seed_(seed) {}
  std::string describe() const override { return "synthetic"; }

  void fill(TensorId tensor, std::int64_t index, float* out) const override {
    const std::int64_t d = dims_.head_dim, hidden = dims_.hidden_size;
    const std::int64_t width = std::int64_t{dims_.num_q_heads} * d;  // o_proj's inputs
    switch (tensor) {
      case TensorId::q_proj:
      case TensorId::k_proj:
      case TensorId::v_proj:  // rows index·D … of [out][hidden]
        bf16_normals(seed_, tensor, static_cast<std::uint64_t>(index * d * hidden), d * hidden,
                     inverse_sqrt(dims_.qkv_bias ? 2 * hidden : hidden), 0.0f, out);
        break;
      case TensorId::o_proj: {  // columns of group `index` of [hidden][Hq·D]
        const std::int64_t g = dims_.group_size() * d;
        for (std::int64_t o = 0; o < hidden; ++o) {
          bf16_normals(seed_, tensor, static_cast<std::uint64_t>(o * width + index * g), g,
                       inverse_sqrt(width), 0.0f, out + o * g);
        }
        break;
      }
      case TensorId::q_bias:
      case TensorId::k_bias:
      case TensorId::v_bias:
        bf16_normals(seed_, tensor, static_cast<std::uint64_t>(index * d), d, kBiasNorm, 0.0f, out);
        break;
      default:  // q_norm, k_norm
        bf16_normals(seed_, tensor, 0, d, 0.125f, 1.0f, out);
    }
  }

 private:
  ModelDims dims_;
  std::uint64_t seed_;
};

}  // namespace

LayerWeights::LayerWeights(const ModelDims& dims, std::uint64_t seed)
    : LayerWeights(dims, std::make_shared<const SyntheticWeights>(dims, seed)) {}

LayerWeights::LayerWeights(const ModelDims& dims, std::shared_ptr<const LayerWeightSource> source)
    : dims_(dims), source_(std::move(source)) {
  if (dims.hidden_size % 4 != 0 || dims.head_dim % 4 != 0)
    throw std::invalid_argument("LayerWeights: hidden_size and head_dim must be multiples of 4");
}

const float* LayerWeights::block(TensorId tensor, std::int64_t index) const {
  const std::lock_guard lock(mutex_);
  std::vector<float>& b = blocks_[{static_cast<int>(tensor), index}];
  if (!b.empty()) return b.data();
  const std::int64_t d = dims_.head_dim, hidden = dims_.hidden_size;
  switch (tensor) {
    case TensorId::q_proj:
    case TensorId::k_proj:
    case TensorId::v_proj:
      b.resize(static_cast<std::size_t>(d * hidden));
      break;
    case TensorId::o_proj:
      b.resize(static_cast<std::size_t>(hidden * dims_.group_size() * d));
      break;
    case TensorId::q_bias:
    case TensorId::k_bias:
    case TensorId::v_bias:
    case TensorId::q_norm:
    case TensorId::k_norm:
      b.resize(static_cast<std::size_t>(d));
      break;
    default:
      throw std::logic_error("LayerWeights: not a weight of the layer");
  }
  source_->fill(tensor, index, b.data());
  return b.data();
}

const float* LayerWeights::projection(TensorId tensor, std::int64_t head) const {
  return block(tensor == TensorId::q   ? TensorId::q_proj
               : tensor == TensorId::k ? TensorId::k_proj
                                       : TensorId::v_proj,
               head);
}

const float* LayerWeights::bias(TensorId tensor, std::int64_t head) const {
  return dims_.qkv_bias ? block(bias_of(tensor), head) : nullptr;
}

const float* LayerWeights::norm(TensorId tensor) const {
  if (!dims_.qk_norm || tensor == TensorId::v) return nullptr;
  return block(tensor == TensorId::q ? TensorId::q_norm : TensorId::k_norm, 0);
}

const float* LayerWeights::o_proj_group(std::int64_t group) const {
  return block(TensorId::o_proj, group);
}

const float* LayerWeights::kept(int key, std::int64_t index,
                                const std::function<std::vector<float>()>& make) const {
  {
    const std::lock_guard lock(mutex_);
    const auto it = blocks_.find({key, index});
    if (it != blocks_.end()) return it->second.data();
  }
  std::vector<float> made = make();  // reads other blocks, each under the lock
  const std::lock_guard lock(mutex_);
  std::vector<float>& b = blocks_[{key, index}];
  if (b.empty()) b = std::move(made);  // another thread may have made it first: the same values
  return b.data();
}

const float* LayerWeights::o_proj_group_transposed(std::int64_t group) const {
  return kept(-static_cast<int>(TensorId::o_proj), group, [&] {
    const std::int64_t hidden = dims_.hidden_size, width = dims_.group_size() * dims_.head_dim;
    const float* w = o_proj_group(group);
    std::vector<float> t(static_cast<std::size_t>(hidden * width));
    for (std::int64_t o = 0; o < hidden; ++o) {
      for (std::int64_t c = 0; c < width; ++c) t[c * hidden + o] = w[o * width + c];
    }
    return t;
  });
}

const float* LayerWeights::qkv_group_transposed(std::int64_t group) const {
  return kept(-static_cast<int>(TensorId::q_proj), group, [&] {
    const std::int64_t hidden = dims_.hidden_size, d = dims_.head_dim;
    const std::int64_t gs = dims_.group_size(), width = (gs + 2) * d;
    std::vector<float> t(static_cast<std::size_t>(hidden * width));
    for (std::int64_t f = 0; f < width; ++f) {
      const std::int64_t head = f / d;  // the group's query heads, then its k and v head
      const float* row = head < gs ? projection(TensorId::q, group * gs + head) + (f % d) * hidden
                         : head == gs ? projection(TensorId::k, group) + (f % d) * hidden
                                      : projection(TensorId::v, group) + (f % d) * hidden;
      for (std::int64_t i = 0; i < hidden; ++i) t[i * width + f] = row[i];
    }
    return t;
  });
}

Problem with_layer_weights(Problem problem) {
  if (problem.layer && !problem.weights)
    problem.weights = std::make_shared<const LayerWeights>(problem.dims, problem.seed);
  return problem;
}

void layer_hidden_row(const Problem& problem, int b, std::int64_t pos, float* row) {
  layer_hidden_rows(problem, b, Range{pos, pos + 1}, row);
}

void layer_hidden_rows(const Problem& problem, int b, Range tokens, float* rows) {
  if (problem.inputs) return problem.inputs->read_rows(TensorId::hidden, b, 0, tokens, rows);
  const std::int64_t hidden = problem.dims.hidden_size;
  for (std::int64_t pos = tokens.begin; pos < tokens.end; ++pos) {
    float* row = rows + (pos - tokens.begin) * hidden;
    const std::int64_t src = input_sequence(TensorId::q, b, pos, shared_prompt_len(problem));
    bf16_normals(problem.seed, TensorId::hidden,
                 static_cast<std::uint64_t>((src * problem.seq_len + pos) * hidden), hidden, 1.0f,
                 0.0f, row);
  }
}

void layer_grad_row(const Problem& problem, int b, std::int64_t pos, float* row) {
  const std::int64_t hidden = problem.dims.hidden_size;
  bf16_normals(problem.seed, TensorId::layer_grad,
               static_cast<std::uint64_t>((b * problem.seq_len + pos) * hidden), hidden, 1.0f, 0.0f,
               row);
}

}  // namespace cpd
