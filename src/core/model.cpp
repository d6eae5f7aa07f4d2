#include "core/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace cpd {

float ModelDims::softmax_scale() const {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

namespace {

// 1e6 rather than 1e+06: a mantissa of one digit where the number has one.
std::string short_number(double x) {
  double power = 1;
  for (int e = 0; e <= 15; ++e, power *= 10) {
    const double m = x / power;
    if (m >= 1 && m < 10 && m == static_cast<double>(static_cast<int>(m)) && e > 2)
      return std::to_string(static_cast<int>(m)) + "e" + std::to_string(e);
  }
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

}  // namespace

std::string rope_text(const RopeSpec& r) {
  std::string text = "theta=" + short_number(r.theta);
  if (r.scaling == RopeScaling::none) return text;
  text += std::string(", ") + to_string(r.scaling) + " x" + short_number(r.factor);
  if (r.scaling == RopeScaling::llama3) {
    text += " (low " + short_number(r.low_freq_factor) + ", high " +
            short_number(r.high_freq_factor) + ", original " + std::to_string(r.original_context) +
            ")";
  }
  return text;
}

std::string tp_problem(const ModelDims& m, int tp) {
  const std::string heads = std::to_string(m.num_q_heads) + " query heads and the " +
                            std::to_string(m.num_kv_heads) + " KV heads of " + m.name;
  if (tp > m.num_kv_heads && m.num_q_heads % tp == 0) {
    return "TP=" + std::to_string(tp) + " exceeds the " + std::to_string(m.num_kv_heads) +
           " KV heads of " + m.name +
           ": vLLM serves that by replicating KV heads, which cpdrift does not emulate (TP must "
           "divide both the " +
           heads + ")";
  }
  if (tp < 1 || m.num_q_heads % tp != 0 || m.num_kv_heads % tp != 0)
    return "TP=" + std::to_string(tp) + " must divide both the " + heads;
  return "";
}

std::string model_slug(const ModelDims& dims) {
  std::string slug = dims.name;
  for (char& c : slug) {
    if (c == '-' || c == '.') c = '_';
  }
  return slug;
}

namespace {

// transformers' _compute_llama3_parameters, per frequency: the long wavelengths (beyond the
// original context / low_freq_factor) slowed by `factor`, the short ones (below it /
// high_freq_factor) kept, the ones between interpolated.
double llama3_scaled(double inv, const RopeSpec& r) {
  const double pi = 3.14159265358979323846;
  const double wavelen = 2 * pi / inv;
  const double context = static_cast<double>(r.original_context);
  const double low_wavelen = context / r.low_freq_factor;
  const double high_wavelen = context / r.high_freq_factor;
  if (wavelen < high_wavelen) return inv;
  if (wavelen > low_wavelen) return inv / r.factor;
  const double smooth =
      (context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1 - smooth) * inv / r.factor + smooth * inv;
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelDims& dims) {
  std::vector<float> inv(static_cast<std::size_t>(dims.rotary_dim / 2));
  for (std::size_t i = 0; i < inv.size(); ++i) {
    const double exponent = -2.0 * static_cast<double>(i) / dims.rotary_dim;
    double f = std::pow(dims.rope.theta, exponent);
    if (dims.rope.scaling == RopeScaling::linear) f /= dims.rope.factor;
    if (dims.rope.scaling == RopeScaling::llama3) f = llama3_scaled(f, dims.rope);
    inv[i] = static_cast<float>(f);
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

const char* to_string(RopeScaling s) { return name_of(kRopeScalingNames, s); }

const char* to_string(DType t) { return name_of(kDTypeNames, t); }

const char* to_string(InputDistribution d) { return name_of(kInputDistributionNames, d); }
const char* to_string(OProjOrder o) { return name_of(kOProjOrderNames, o); }

}  // namespace cpd
