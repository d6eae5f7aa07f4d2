// Inputs shaped like real attention (`--input-distribution`): documented, deterministic
// changes to the standard normals before RoPE, so that sink tokens and outlier channels — where
// BF16 and merge order hurt most — are measured too.
//
// Every change is a pure function of (distribution, tensor, global head, position, channel):
// any rank or GPU thread shapes exactly its slice, and every topology sees the same tensors.
// Each is one exact FP32 multiply or one FP32 add per element, so CPU and GPU agree bitwise.
//
//   gaussian          the normals unchanged.
//   sink              the attention sink of every sequence's first token: on the sink channels
//                     (the kSinkPairs lowest-frequency RoPE pairs, channels [h-8, h) and
//                     [D-8, D), h = D/2, which RoPE turns by under 0.2 rad at 32K tokens with
//                     theta = 1e6) every query gets + kSinkQuery and the key at position 0 gets
//                     + kSinkKey: that key's score exceeds the others' by
//                     2·kSinkPairs·kSinkQuery·kSinkKey/sqrt(D) = 12.0 for D = 128, so it takes
//                     most of the attention of short and medium contexts.
//   outlier_channels  a few massive key channels, as LLM key caches show (KIVI, KVQuant): in
//                     every KV head g the kOutlierChannels channels (7g + 32j + 3) mod D,
//                     j = 0…3, of k are multiplied by kOutlierScale (exact in FP32).
//   mix               outlier_channels, then sink.
//
// Only q and k are shaped: v, dO and the lm_head are the normals of every distribution. A model
// with a qkv bias adds it to q, k and v after the shaping (bias_of, below).
#pragma once

#include "cpdrift/hd.h"
#include "cpdrift/philox.h"

namespace cpd {

enum class InputDistribution { gaussian, sink, outlier_channels, mix };

inline constexpr int kSinkPairs = 8;
inline constexpr float kSinkQuery = 2.0f;
inline constexpr float kSinkKey = 4.25f;
inline constexpr int kOutlierChannels = 4;
inline constexpr float kOutlierScale = 8.0f;

/// Whether channel `c` of a head of width `dim` is one of the sink channels.
CPD_HD bool is_sink_channel(int c, int dim) {
  const int half = dim / 2;
  return (c >= half - kSinkPairs && c < half) || c >= dim - kSinkPairs;
}

/// Whether channel `c` is one of KV head `kv_head`'s outlier channels.
CPD_HD bool is_outlier_channel(long long kv_head, int c, int dim) {
  for (int j = 0; j < kOutlierChannels; ++j) {
    if ((7 * kv_head + 32 * j + 3) % dim == c) return true;
  }
  return false;
}

/// A model with a qkv bias (Qwen2's q_proj, k_proj and v_proj): element c of head h of q, k or v
/// is (x + b[h][c])·kBiasNorm, b a standard normal (element h·dim + c of the tensor's bias
/// stream), after the distribution's shaping and before RoPE, where the model adds its bias.
/// Half the variance is then a per-channel mean and the total stays one, as every other
/// model's inputs, so the gates set for unit-variance inputs hold alike: the regime where a bias
/// matters to the bits — k's cancels from the softmax in exact arithmetic (a per-row constant of
/// the scores) but not once k + b is rounded to BF16, q's moves the scores, v's the output.
inline constexpr float kBiasNorm = 0.70710678118654752f;  // 1/sqrt(2), rounded to FP32

/// x + b, then ·kBiasNorm: two FP32 operations, no fma.
CPD_HD float add_bias(float x, float b) {
  const float sum = x + b;
  return sum * kBiasNorm;
}

/// The bias stream of q, k or v.
CPD_HD TensorId bias_of(TensorId tensor) {
  return tensor == TensorId::q   ? TensorId::q_bias
         : tensor == TensorId::k ? TensorId::k_bias
                                 : TensorId::v_bias;
}

/// Element (kv_head, pos, c) of tensor `tensor`, standard normal `x`, as `distribution` shapes
/// it (before RoPE). `kv_head` is the KV head a query head reads (h / group size) for q.
CPD_HD float shape_input(InputDistribution distribution, TensorId tensor, long long kv_head,
                         long long pos, int c, int dim, float x) {
  const bool outliers =
      distribution == InputDistribution::outlier_channels || distribution == InputDistribution::mix;
  const bool sink =
      distribution == InputDistribution::sink || distribution == InputDistribution::mix;
  if (outliers && tensor == TensorId::k && is_outlier_channel(kv_head, c, dim))
    x = x * kOutlierScale;
  if (sink && is_sink_channel(c, dim)) {
    if (tensor == TensorId::q) x = x + kSinkQuery;
    if (tensor == TensorId::k && pos == 0) x = x + kSinkKey;
  }
  return x;
}

}  // namespace cpd
