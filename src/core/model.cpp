#include "core/model.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cpd {

float ModelDims::softmax_scale() const {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

std::vector<float> rope_inv_freq(const ModelDims& dims) {
  std::vector<float> inv(static_cast<std::size_t>(dims.rotary_dim / 2));
  for (std::size_t i = 0; i < inv.size(); ++i) {
    const double exponent = -2.0 * static_cast<double>(i) / dims.rotary_dim;
    inv[i] = static_cast<float>(std::pow(dims.rope_theta, exponent));
  }
  return inv;
}

int heads_of(const ModelDims& dims, TensorId tensor) {
  return tensor == TensorId::k || tensor == TensorId::v ? dims.num_kv_heads : dims.num_q_heads;
}

std::int64_t shared_prompt_len(const Problem& p) {
  if (p.batch < 2 || p.inputs) return 0;
  const std::int64_t shortest = p.seq_len - (p.batch - 1) * (p.seq_len / (4 * p.batch) + 1);
  if (shortest <= 0) return 0;
  return std::max<std::int64_t>(shortest / 4, std::min<std::int64_t>(16, shortest / 3));
}

const char* to_string(DType t) { return name_of(kDTypeNames, t); }

const char* to_string(InputDistribution d) { return name_of(kInputDistributionNames, d); }

}  // namespace cpd
