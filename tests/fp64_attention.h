// Test support: the independent oracle of the attention kernels, a naive FP64 attention.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace cpd::testing {

/// FP64 attention of one query row over key rows [0, n) (`dim` floats each, contiguous):
/// out ← softmax(scale·q·kᵀ)·v, lse ← log Σ exp(scale·q·kᵀ).
inline void attention_fp64(const float* q, const float* k, const float* v, std::int64_t n, int dim,
                           double scale, std::vector<double>& out, double& lse) {
  std::vector<double> s(static_cast<std::size_t>(n));
  double m = -INFINITY;
  for (std::int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int d = 0; d < dim; ++d) dot += static_cast<double>(q[d]) * k[j * dim + d];
    s[j] = dot * scale;
    m = std::max(m, s[j]);
  }
  out.assign(static_cast<std::size_t>(dim), 0.0);
  double l = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    const double p = std::exp(s[j] - m);
    l += p;
    for (int d = 0; d < dim; ++d) out[d] += p * v[j * dim + d];
  }
  for (double& o : out) o /= l;
  lse = m + std::log(l);
}

}  // namespace cpd::testing
