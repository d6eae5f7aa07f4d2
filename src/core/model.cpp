#include "cpdrift/core/model.h"

#include <cmath>

namespace cpd {

float ModelDims::softmax_scale() const {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

const char* to_string(DType t) { return t == DType::bf16 ? "bf16" : "fp32"; }

}  // namespace cpd
