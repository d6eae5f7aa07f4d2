#include "cpdrift/core/model.h"

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

const char* to_string(DType t) { return name_of(kDTypeNames, t); }

}  // namespace cpd
