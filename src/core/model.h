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

/// How RoPE's inverse frequencies are scaled: transformers' `rope_type` (modeling_rope_utils.py).
enum class RopeScaling { none, linear, llama3 };
inline constexpr EnumName<RopeScaling> kRopeScalingNames[] = {{RopeScaling::none, "default"},
                                                              {RopeScaling::linear, "linear"},
                                                              {RopeScaling::llama3, "llama3"}};
const char* to_string(RopeScaling);

struct RopeSpec {
  double theta = 1.0e6;
  RopeScaling scaling = RopeScaling::none;
  double factor = 1;                     // linear and llama3: the context extension
  double low_freq_factor = 1;            // llama3
  double high_freq_factor = 4;           // llama3
  std::int64_t original_context = 8192;  // llama3: original_max_position_embeddings
};

/// Where the default's description was read (models.cpp holds the other entries' sources).
inline constexpr const char* kQwen3_8bSource =
    "huggingface.co/Qwen/Qwen3-8B@2069b3fae1114555f3c020c81410e51fa0f656f2";

/// A model's attention, as cpdrift reads it (docs/models.md): causal, GQA, RoPE in GPT-NeoX
/// rotate-half form over the whole head dim. The default is Qwen3-8B; models.h holds the table
/// of real configurations and model_config.h reads a model's own config.json.
struct ModelDims {
  std::string name = "qwen3-8b";
  /// Where the description came from: a table entry's Hugging Face repository and revision, or
  /// the config file read.
  std::string source = kQwen3_8bSource;
  int hidden_size = 4096;
  int num_q_heads = 32;
  int num_kv_heads = 8;
  int head_dim = 128;
  int rotary_dim = 128;
  RopeSpec rope;
  bool qk_norm = true;    // per-head RMSNorm of q and k before RoPE (the layer's; qwen3)
  bool qkv_bias = false;  // q_proj, k_proj and v_proj add a bias (qwen2)
  double rms_norm_eps = 1e-6;
  int vocab_size = 151936;

  int group_size() const { return num_q_heads / num_kv_heads; }
  /// 1/sqrt(head_dim) rounded once to FP32 (applied after the dot product).
  float softmax_scale() const;
};

/// "theta=1e6", with the scaling when there is one: "theta=5e5, llama3 x8 (low 1, high 4,
/// original 8192)".
std::string rope_text(const RopeSpec& rope);

/// Why `tp` ranks cannot split `dims`'s heads ("" when they can): TP must divide the query and
/// the KV heads. A TP above the KV heads, which vLLM serves by replicating KV heads, is refused
/// with that reason.
std::string tp_problem(const ModelDims& dims, int tp);

/// The model's name as case names spell it: qwen3-8b → qwen3_8b, llama-3.1-8b → llama_3_1_8b.
std::string model_slug(const ModelDims& dims);

/// inv_freq[i], i < rotary_dim/2: θ^(-2i/rotary_dim), then the model's scaling (transformers'
/// `_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`), all in FP64 and
/// rounded to FP32 once (docs/models.md says how that relates to transformers' FP32 table). The
/// CUDA backend receives this table, so both backends rotate identically.
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

class LayerWeights;  // kernels/layer_weights.h

/// How the layer's o_proj sums its head groups' partials (docs/numerics.md §11). canonical: one
/// fold over the groups in ascending order, continued from TP rank to TP rank, the same bits at
/// every TP. rank_sums: each TP rank folds its own groups from zero and the ranks' sums are added
/// in rank order (what a reduce of per-rank partials does): the control that shows TP changes
/// bits off the grid.
enum class OProjOrder { canonical, rank_sums };
inline constexpr EnumName<OProjOrder> kOProjOrderNames[] = {{OProjOrder::canonical, "canonical"},
                                                            {OProjOrder::rank_sums, "rank_sums"}};
const char* to_string(OProjOrder);

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
  /// The whole attention layer (--scope layer, docs/numerics.md §11): q, k and v are the
  /// projections of the layer's hidden states, and o_proj follows the attention. Its weights,
  /// once a run has made them (with_layer_weights); null in a layer problem, generate_shard makes
  /// its own.
  bool layer = false;
  std::shared_ptr<const LayerWeights> weights;
  OProjOrder o_proj_order = OProjOrder::canonical;
  /// The layer's reduction lanes (numerics.md §12: the stacks' sums over TP and over DP × CP);
  /// --no-reduction-lanes turns them off, and their time and memory with them.
  bool reduction_lanes = true;
};

/// The shared prompt: with two or more sequences, their first max(⌊shortest/4⌋, min(16,
/// ⌊shortest/3⌋)) tokens (at least a 16-token page where the sequences allow) are one prompt (q, k
/// and v rows equal to sequence 0's; input_sequence in philox.h), where shortest = S −
/// (B−1)·(⌊S/(4B)⌋ + 1) is the rollout workload's shortest sequence (paged_workload.h); none with
/// one sequence, and none for inputs read from a file (whose sequences are their own). A pure
/// function of the problem, so every case, path and process sees the same inputs.
std::int64_t shared_prompt_len(const Problem& problem);

}  // namespace cpd
