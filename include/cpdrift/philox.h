// Counter-based random inputs: Philox-4x32-10 and a Box–Muller normal transform.
//
// Every input tensor element is a pure function of (seed, tensor id, global linear index), so
// any rank (or GPU thread) generates exactly its slice with no communication, and every case
// and topology sees the same global tensors.
#pragma once

#include <cstdint>

#include "cpdrift/fmath.h"
#include "cpdrift/hd.h"

namespace cpd {

/// The tensors cpdrift generates; the value is part of the Philox counter. The biases are those
/// of a model with a qkv bias (input_shape.h's qkv_bias).
enum class TensorId : std::uint32_t {
  q = 1,
  k = 2,
  v = 3,
  d_out = 4,
  lm_head = 5,
  q_bias = 6,
  k_bias = 7,
  v_bias = 8,
  // The attention layer's synthetic inputs and weights (kernels/layer_weights.h).
  hidden = 9,
  q_proj = 10,
  k_proj = 11,
  v_proj = 12,
  o_proj = 13,
  q_norm = 14,
  k_norm = 15,
  layer_grad = 16  // the gradient of the layer's output, which the backward starts from
};

struct Philox4x32 {
  std::uint32_t v[4];
};

/// Philox-4x32-10 (Salmon et al., SC'11), exactly as Random123's philox4x32_10.
CPD_HD Philox4x32 philox4x32_10(Philox4x32 ctr, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * ctr.v[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * ctr.v[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
  }
  return ctr;
}

/// A uniform in (0, 1) from 23 random bits: (2k+1)·2^-24, exact in FP32, never 0 or 1.
CPD_HD float uniform_open01(std::uint32_t bits) {
  return static_cast<float>(((bits >> 9) << 1) | 1u) * 5.9604644775390625e-08f;  // 2^-24
}

/// The Philox block `block` of tensor `tensor`: counter = (block lo, block hi, tensor id, 0),
/// key = (seed lo, seed hi).
CPD_HD Philox4x32 philox_block(std::uint64_t seed, TensorId tensor, std::uint64_t block) {
  const Philox4x32 ctr{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                        static_cast<std::uint32_t>(tensor), 0u}};
  return philox4x32_10(ctr, static_cast<std::uint32_t>(seed),
                       static_cast<std::uint32_t>(seed >> 32));
}

/// Box–Muller on one pair of Philox words: r = sqrt(-2·log(u(radius_bits))),
/// (cos, sin)(2π·u(angle_bits)); x = r·cos, y = r·sin. All FP32 with the project's own log and
/// sincos.
CPD_HD void box_muller(std::uint32_t radius_bits, std::uint32_t angle_bits, float& x, float& y) {
  const float radius = sqrt_f32(-2.0f * log_f32(uniform_open01(radius_bits)));
  float s, c;
  sincos_2pi_f32(uniform_open01(angle_bits), s, c);
  x = radius * c;
  y = radius * s;
}

/// Four standard normals for the Philox block `block` of tensor `tensor`: elements
/// 4·block … 4·block+3 of the tensor's global linear index space. Box–Muller on the word
/// pairs (0,1) and (2,3): lane 2i gets r·cos, lane 2i+1 gets r·sin. (kernels/cpu/normals.h computes
/// rows of blocks with the same two functions, vectorised.)
CPD_HD void normal4(std::uint64_t seed, TensorId tensor, std::uint64_t block, float out[4]) {
  const Philox4x32 r = philox_block(seed, tensor, block);
  box_muller(r.v[0], r.v[1], out[0], out[1]);
  box_muller(r.v[2], r.v[3], out[2], out[3]);
}

/// The sequence whose random numbers row (b, pos) of `tensor` takes: inside the shared prompt
/// (pos < prompt_len) every sequence's q, k and v rows are sequence 0's — one prompt, several
/// responses, as in an RL rollout group (design §2). dO and the lm_head are never shared.
CPD_HD long long input_sequence(TensorId tensor, long long b, long long pos, long long prompt_len) {
  const bool qkv = tensor == TensorId::q || tensor == TensorId::k || tensor == TensorId::v;
  return qkv && pos < prompt_len ? 0 : b;
}

/// One standard normal: element `index` of tensor `tensor` (a slice of normal4).
CPD_HD float normal_at(std::uint64_t seed, TensorId tensor, std::uint64_t index) {
  float four[4];
  normal4(seed, tensor, index >> 2, four);
  return four[index & 3u];
}

}  // namespace cpd
