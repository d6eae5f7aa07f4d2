// The attention problem cpdrift measures: model dimensions and the global input tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/input_source.h"
#include "cpdrift/enum_names.h"
#include "cpdrift/input_shape.h"
#include "cpdrift/philox.h"

namespace cpd {

/// Qwen3-8B attention: 32 query heads, 8 KV heads (GQA group 4), head dim 128, causal,
/// RoPE GPT-NeoX rotate-half with theta 1e6 over the full head dim.
struct ModelDims {
  int num_q_heads = 32;
  int num_kv_heads = 8;
  int head_dim = 128;
  int rotary_dim = 128;
  double rope_theta = 1.0e6;

  int group_size() const { return num_q_heads / num_kv_heads; }
  /// 1/sqrt(head_dim) rounded once to FP32 (applied after the dot product).
  float softmax_scale() const;
};

/// inv_freq[i] = theta^(-2i/rotary_dim), i < rotary_dim/2: computed in FP64 and rounded to
/// FP32 once. The CUDA backend receives this table, so both backends rotate identically.
std::vector<float> rope_inv_freq(const ModelDims& dims);

/// Heads of a tensor: q and dO are query-head tensors, k and v KV-head tensors.
int heads_of(const ModelDims& dims, TensorId tensor);

enum class DType { bf16, fp32 };
inline constexpr EnumName<DType> kDTypeNames[] = {{DType::bf16, "bf16"}, {DType::fp32, "fp32"}};
const char* to_string(DType);

inline constexpr EnumName<InputDistribution> kInputDistributionNames[] = {
    {InputDistribution::gaussian, "gaussian"},
    {InputDistribution::sink, "sink"},
    {InputDistribution::outlier_channels, "outlier_channels"},
    {InputDistribution::mix, "mix"}};
const char* to_string(InputDistribution);

/// Precision of the values a path reads: FP32, or the BF16 rounding of them (q and k are
/// rounded after RoPE, `rope_cast_at: rope_output`; v directly).
enum class InputPrecision { fp32, bf16 };

/// The global problem every case of a run shares: same seed, same tensors.
struct Problem {
  ModelDims dims;
  int batch = 1;
  std::int64_t seq_len = 16;
  std::uint64_t seed = 2355;
  bool rope = true;
  DType dtype = DType::bf16;
  InputDistribution distribution = InputDistribution::gaussian;  // cpdrift/input_shape.h
  /// q, k and v read from a file (`--inputs`) instead of generated; null: generated. dO and the
  /// lm_head are generated either way.
  std::shared_ptr<const InputSource> inputs;
};

/// The shared prompt: with two or more sequences, their first max(⌊shortest/4⌋, min(16,
/// ⌊shortest/3⌋)) tokens (at least a 16-token page where the sequences allow) are one prompt (q, k
/// and v rows equal to sequence 0's; input_sequence in philox.h), where shortest = S −
/// (B−1)·(⌊S/(4B)⌋ + 1) is the rollout workload's shortest sequence (paged_workload.h); none with
/// one sequence, and none for inputs read from a file (whose sequences are their own). A pure
/// function of the problem, so every case, path and process sees the same inputs.
std::int64_t shared_prompt_len(const Problem& problem);

}  // namespace cpd
