// Rotary position embedding, GPT-NeoX rotate-half form (Qwen3: theta = 1e6, rotary dim 128).
//
// y[i]     = x[i]·cos(a_i) - x[i+h]·sin(a_i)
// y[i+h]   = x[i+h]·cos(a_i) + x[i]·sin(a_i),   i < h = rotary_dim / 2,
// a_i      = fp32(position) · inv_freq[i]       (one FP32 product, as torch computes freqs)
//
// Products and the sum are separate FP32 operations (no fma), as PyTorch's eager
// `q * cos + rotate_half(q) * sin` rounds them. inv_freq is a host-computed FP32 table
// (see kernels/cpu/rope_table.h) that the CUDA backend receives unchanged, so both sides agree.
#pragma once

#include <cstdint>

#include "cpdrift/fmath.h"
#include "cpdrift/hd.h"

namespace cpd {

/// cos/sin of the RoPE angle of one (position, frequency) pair.
CPD_HD void rope_cos_sin(std::int64_t position, float inv_freq, float& c, float& s) {
  const float angle = static_cast<float>(position) * inv_freq;
  sincos_f32(angle, s, c);
}

/// Rotates one (x[i], x[i + half]) pair by the angle with cos c and sin s.
CPD_HD void rope_rotate_pair(float& x1, float& x2, float c, float s) {
  const float a = x1 * c, b = x2 * s;
  const float e = x2 * c, f = x1 * s;
  x1 = a - b;
  x2 = e + f;
}

/// Rotates one row in place given its per-frequency cos/sin (`half` entries each). Elements
/// at or beyond 2·half (none for Qwen3, whose rotary dim equals the head dim) are untouched.
CPD_HD void rope_rotate_row(float* x, const float* cos_row, const float* sin_row, int half) {
  for (int i = 0; i < half; ++i) rope_rotate_pair(x[i], x[i + half], cos_row[i], sin_row[i]);
}

}  // namespace cpd
