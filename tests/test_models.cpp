// The model description (docs/models.md): the table, a model's own config.json read as
// transformers reads it, the RoPE inverse-frequency table against the published formula, and the
// qkv bias of the generated inputs against its definition.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/errors.h"
#include "core/models.h"
#include "cpdrift/input_shape.h"
#include "cpdrift/philox.h"
#include "inputs/model_config.h"
#include "kernels/cpu/inputs.h"

using namespace cpd;

namespace {

const ModelDims& model(const char* name) {
  const ModelDims* m = find_model(name);
  REQUIRE(m != nullptr);
  return *m;
}

// The published formulas, written here from transformers' modeling_rope_utils.py
// (_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
// _compute_llama3_parameters) in FP64, each entry rounded once to FP32.
std::vector<float> published_inv_freq(const ModelDims& m, bool apply_scaling = true) {
  const int dim = m.head_dim;
  std::vector<float> table;
  for (int i = 0; i < dim; i += 2) {
    double inv = 1.0 / std::pow(m.rope.theta, static_cast<double>(i) / dim);
    const RopeSpec& r = m.rope;
    if (apply_scaling && r.scaling == RopeScaling::linear) inv = inv / r.factor;
    if (apply_scaling && r.scaling == RopeScaling::llama3) {
      const double original = static_cast<double>(r.original_context);
      const double low_wavelen = original / r.low_freq_factor;
      const double high_wavelen = original / r.high_freq_factor;
      const double wavelen = 2 * M_PI / inv;
      if (wavelen > low_wavelen) {
        inv = inv / r.factor;
      } else if (wavelen >= high_wavelen) {  // the medium band: interpolated
        const double smooth =
            (original / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        inv = (1 - smooth) * inv / r.factor + smooth * inv;
      }
    }
    table.push_back(static_cast<float>(inv));
  }
  return table;
}

std::size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// The refusal parse_model_config gives `text`, or "" when it accepts it.
std::string refusal(const std::string& text) {
  try {
    parse_model_config(text, "c.json");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

constexpr const char* kQwen25_3b = R"({"model_type": "qwen2", "hidden_size": 2048,
  "num_attention_heads": 16, "num_key_value_heads": 2, "rope_theta": 1000000.0,
  "rms_norm_eps": 1e-06, "vocab_size": 151936, "use_sliding_window": false,
  "rope_scaling": null})";

}  // namespace

TEST_CASE("models: the table's default is Qwen3-8B, and every entry can run") {
  const ModelDims def;
  const ModelDims& q8 = model("qwen3-8b");
  CHECK(known_models().front().name == "qwen3-8b");
  CHECK(q8.source == def.source);
  CHECK(q8.hidden_size == 4096);
  CHECK((q8.num_q_heads == 32 && q8.num_kv_heads == 8 && q8.head_dim == 128));
  CHECK(q8.rope.theta == 1e6);
  CHECK(q8.qk_norm);
  CHECK_FALSE(q8.qkv_bias);
  CHECK(known_models().size() >= 7);
  for (const ModelDims& m : known_models()) {
    CAPTURE(m.name);
    CHECK(model_problem(m).empty());
    // Pinned: repository@40-hex revision.
    const std::size_t at = m.source.find('@');
    REQUIRE(at != std::string::npos);
    CHECK(m.source.rfind("huggingface.co/", 0) == 0);
    CHECK(m.source.size() - at - 1 == 40);
  }
  // The shapes the issue names: hidden ≠ heads × head dim, GQA groups of 5 and 7, Llama 3.
  CHECK((model("qwen3-4b").hidden_size == 2560 && model("qwen3-4b").head_dim == 128));
  CHECK(model("qwen3-14b").group_size() == 5);
  CHECK(model("qwen3-32b").num_q_heads == 64);
  CHECK((model("qwen3-30b-a3b").hidden_size == 2048 && model("qwen3-30b-a3b").num_kv_heads == 4));
  CHECK(model("qwen2.5-7b").group_size() == 7);
  CHECK(model("qwen2.5-7b").qkv_bias);
  CHECK_FALSE(model("qwen2.5-7b").qk_norm);
  const ModelDims& llama = model("llama-3.1-8b");
  CHECK((llama.rope.scaling == RopeScaling::llama3 && llama.rope.factor == 8 &&
         llama.rope.original_context == 8192 && llama.rms_norm_eps == 1e-5));
  CHECK(find_model("qwen3-9b") == nullptr);
  CHECK(model_slug(llama) == "llama_3_1_8b");
}

TEST_CASE("models: TP must divide both head counts; above the KV heads the reason is replication") {
  CHECK(tp_problem(model("qwen3-8b"), 8).empty());
  CHECK(tp_problem(model("qwen3-14b"), 8).empty());
  CHECK(tp_problem(model("qwen3-32b"), 16).find("replicating KV heads") != std::string::npos);
  CHECK(tp_problem(model("qwen2.5-7b"), 3).find("must divide both the 28 query heads") !=
        std::string::npos);
  CHECK(tp_problem(model("qwen2.5-7b"), 4).empty());
  CHECK(tp_problem(model("qwen2.5-7b"), 8).find("must divide") != std::string::npos);
}

TEST_CASE("RoPE table: bitwise the published formula, Llama 3's scaling included") {
  for (const ModelDims& m : known_models()) {
    CAPTURE(m.name);
    CHECK(differing(rope_inv_freq(m), published_inv_freq(m)) == 0);
  }
  ModelDims linear = model("qwen3-8b");
  linear.rope.scaling = RopeScaling::linear;
  linear.rope.factor = 4;
  CHECK(differing(rope_inv_freq(linear), published_inv_freq(linear)) == 0);
  // Llama 3's bands: the short wavelengths kept, the long ones slowed 8×, some interpolated.
  const ModelDims& llama = model("llama-3.1-8b");
  const std::vector<float> scaled = rope_inv_freq(llama), plain = published_inv_freq(llama, false);
  int kept = 0, slowed = 0, between = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    if (scaled[i] == plain[i])
      ++kept;
    else if (scaled[i] == static_cast<float>(static_cast<double>(plain[i]) / 8) ||
             std::abs(scaled[i] * 8 / plain[i] - 1) < 1e-6)
      ++slowed;
    else
      ++between;
  }
  CHECK(kept > 0);
  CHECK(slowed > 0);
  CHECK(between > 0);
  CHECK(kept + slowed + between == 64);
  // Negative control: the table without the scaling is not Llama's.
  CHECK(differing(rope_inv_freq(llama), plain) > 0);
}

TEST_CASE("config.json: an unlisted model of a listed family runs, fields read as transformers") {
  const ModelDims m = parse_model_config(kQwen25_3b, "c.json");
  CHECK((m.num_q_heads == 16 && m.num_kv_heads == 2 && m.head_dim == 128));
  CHECK(m.hidden_size == 2048);
  CHECK(m.qkv_bias);  // qwen2: q, k and v projections with a bias, whatever the file says
  CHECK_FALSE(m.qk_norm);
  CHECK(m.rope.scaling == RopeScaling::none);
  CHECK(m.source == "c.json");
  // qwen3: QK-norm; head_dim from its field, not hidden / heads (Qwen3-4B: 2560 / 32 = 80).
  const ModelDims q4 = parse_model_config(
      R"({"model_type": "qwen3", "hidden_size": 2560, "num_attention_heads": 32,
          "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000,
          "rms_norm_eps": 1e-6, "vocab_size": 151936, "attention_bias": false})",
      "q4.json");
  CHECK(q4.head_dim == 128);
  CHECK(q4.qk_norm);
  CHECK_FALSE(q4.qkv_bias);
  // llama: rope_scaling by its rope_type; num_key_value_heads absent → MHA.
  const ModelDims l = parse_model_config(
      R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
          "num_key_value_heads": 8, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
          "vocab_size": 128256, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
          "rope_type": "llama3"}})",
      "l.json");
  CHECK(differing(rope_inv_freq(l), rope_inv_freq(model("llama-3.1-8b"))) == 0);
  CHECK(parse_model_config(R"({"model_type": "llama", "hidden_size": 512,
      "num_attention_heads": 4, "vocab_size": 100})",
                           "mha.json")
            .num_kv_heads == 4);
}

TEST_CASE("config.json: what cannot run is refused in one line naming the field") {
  CHECK(refusal(kQwen25_3b).empty());
  CHECK(refusal("{").rfind("c.json: not a JSON config file", 0) == 0);
  CHECK(refusal("[1]") == "c.json: not a config.json: the top level is not an object");
  CHECK(refusal(R"({"hidden_size": 8})") == "c.json: missing field 'model_type'");
  CHECK(refusal(R"({"model_type": "gpt2"})") ==
        "c.json: model_type 'gpt2' is not supported (llama, qwen2, qwen3, qwen3_moe)");
  CHECK(refusal(R"({"model_type": "qwen2", "num_attention_heads": 16, "vocab_size": 10})") ==
        "c.json: missing field 'hidden_size'");
  CHECK(refusal(R"({"model_type": "qwen2", "hidden_size": 2048, "num_attention_heads": 16,
      "num_key_value_heads": 5, "vocab_size": 10})") ==
        "c.json: 5 KV heads do not divide the 16 query heads (GQA groups of equal size)");
  CHECK(refusal(R"({"model_type": "qwen2", "hidden_size": 2050, "num_attention_heads": 16,
      "vocab_size": 10})") ==
        "c.json: hidden_size 2050 is not a multiple of "
        "num_attention_heads 16, and there is no head_dim");
  CHECK(refusal(R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
      "vocab_size": 10, "rope_scaling": {"rope_type": "yarn", "factor": 4}})") ==
        "c.json: rope scaling 'yarn' is not supported (default, linear, llama3)");
  CHECK(refusal(R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
      "vocab_size": 10, "rope_scaling": {"rope_type": "llama3", "factor": 8}})") ==
        "c.json: missing field 'rope_scaling.low_freq_factor'");
  CHECK(refusal(R"({"model_type": "qwen2", "hidden_size": 2048, "num_attention_heads": 16,
      "vocab_size": 10, "use_sliding_window": true})") ==
        "c.json: sliding-window attention is not supported");
  CHECK(refusal(R"({"model_type": "qwen2", "hidden_size": 2048, "num_attention_heads": 16,
      "vocab_size": "big"})") == "c.json: 'vocab_size' must be a positive integer");
  CHECK(refusal(R"({"model_type": "qwen2", "hidden_size": 96, "num_attention_heads": 16,
      "vocab_size": 10})") ==
        "c.json: head dim 6: the kernels take a multiple of 64 from 64 to 256");
  // 32: a multiple of 4 the CPU attention tiles cannot take (it ran into them, status 3).
  CHECK(refusal(R"({"model_type": "qwen3", "hidden_size": 128, "num_attention_heads": 8,
      "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 10})") ==
        "c.json: head dim 32: the kernels take a multiple of 64 from 64 to 256");
}

TEST_CASE("qkv bias: generated q, k, v are (x + b)·2^-1/2 as input_shape.h defines, before RoPE") {
  Problem p;
  p.dims = model("qwen2.5-7b");
  p.seq_len = 8;
  p.rope = false;
  ThreadPool pool(1);
  Problem plain = p;
  plain.dims.qkv_bias = false;
  const int d = p.dims.head_dim;
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v}) {
    CAPTURE(static_cast<int>(t));
    const int heads = heads_of(p.dims, t);
    const ShardShape shape{1, Range{0, heads}, {Range{0, p.seq_len}}, d};
    const Shard biased = generate_shard(p, t, shape, InputPrecision::fp32, pool);
    const Shard x = generate_shard(plain, t, shape, InputPrecision::fp32, pool);
    std::size_t exact = 0, total = 0;
    double worst = 0;
    for (int h = 0; h < heads; ++h) {
      for (std::int64_t pos = 0; pos < p.seq_len; ++pos) {
        for (int c = 0; c < d; ++c) {
          const float xv = x.at(0, h, pos)[c];
          const float b = normal_at(p.seed, bias_of(t), static_cast<std::uint64_t>(h * d + c));
          const float got = biased.at(0, h, pos)[c];
          const float sum = xv + b;  // the definition: two FP32 operations
          exact += got == sum * kBiasNorm;
          ++total;
          // The FP64 value: two roundings of at most 2^-24 relative each.
          const double oracle = (static_cast<double>(xv) + b) / std::sqrt(2.0);
          worst = std::max(worst, std::abs(got - oracle) / (std::abs(oracle) + 1e-30));
        }
      }
    }
    CHECK(exact == total);
    CHECK(worst <= 3 * std::ldexp(1.0, -24));
  }
  // Negative control: the bias changes the inputs; and every KV head of k has its own.
  const ShardShape shape{1, Range{0, 2}, {Range{0, 1}}, d};
  const Shard with = generate_shard(p, TensorId::k, shape, InputPrecision::fp32, pool);
  const Shard without = generate_shard(plain, TensorId::k, shape, InputPrecision::fp32, pool);
  CHECK(std::memcmp(with.at(0, 0, 0), without.at(0, 0, 0), d * sizeof(float)) != 0);
  // The default model has no bias: its inputs are unchanged (its digests are pinned).
  CHECK_FALSE(ModelDims{}.qkv_bias);
}
