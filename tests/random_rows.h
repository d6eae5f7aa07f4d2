// Test support for the kernel tests: seeded rows of standard normals (std's or the generator's),
// and bit-for-bit comparison of float buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "cpdrift/bf16.h"
#include "cpdrift/philox.h"

namespace cpd::testing {

/// rows × dim standard normals from `seed` (rounded to BF16 when asked).
inline std::vector<float> random_rows(std::int64_t rows, std::uint64_t seed, int dim = 128,
                                      bool bf16 = false) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<std::size_t>(rows) * dim);
  for (float& x : v) x = bf16 ? round_bf16(normal(rng)) : normal(rng);
  return v;
}

/// n of the counter-based generator's standard normals (stream `tensor` of `seed`), times scale.
inline std::vector<float> philox_normals(std::uint64_t seed, TensorId tensor, std::size_t n,
                                         float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = normal_at(seed, tensor, i) * scale;
  return v;
}

inline bool same_bits(const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (bits_of(a[i]) != bits_of(b[i])) return false;
  }
  return true;
}

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

}  // namespace cpd::testing
