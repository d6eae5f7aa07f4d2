#include "inputs/model_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"
#include "core/models.h"
#include "core/util/sha256.h"
#include "report/json.h"

namespace cpd {

namespace {

// The families whose attention cpdrift computes, and what each decides where a config has no
// field: transformers' Qwen3Attention (q_norm, k_norm; qkv bias from attention_bias),
// Qwen2Attention (q, k and v projections with a bias, no norm), LlamaAttention (bias from
// attention_bias). Qwen3-MoE's attention is Qwen3's.
struct Family {
  const char* model_type;
  bool qk_norm;
  bool qkv_bias_always;
};
constexpr Family kFamilies[] = {{"llama", false, false},
                                {"qwen2", false, true},
                                {"qwen3", true, false},
                                {"qwen3_moe", true, false}};

class ConfigReader {
 public:
  ConfigReader(const json::Value& root, const std::string& path) : root_(root), path_(path) {}

  [[noreturn]] void refuse(const std::string& what) const { throw UsageError(path_ + ": " + what); }

  const json::Value* field(const json::Value& object, const std::string& key) const {
    return object.contains(key) && !object.at(key).is_null() ? &object.at(key) : nullptr;
  }

  int integer(const std::string& key, const int* fallback = nullptr) const {
    const json::Value* v = field(root_, key);
    if (!v) {
      if (fallback) return *fallback;
      refuse("missing field '" + key + "'");
    }
    if (!v->is_integer() || v->as_int64() < 1 || v->as_int64() > (1 << 30))
      refuse("'" + key + "' must be a positive integer");
    return static_cast<int>(v->as_int64());
  }

  double number(const json::Value& object, const std::string& key, const std::string& where,
                const double* fallback = nullptr) const {
    const json::Value* v = field(object, key);
    if (!v) {
      if (fallback) return *fallback;
      refuse("missing field '" + where + key + "'");
    }
    if (!v->is_number()) refuse("'" + where + key + "' must be a number");
    return v->as_double();
  }

  bool flag(const std::string& key) const {
    const json::Value* v = field(root_, key);
    if (v && !v->is_bool()) refuse("'" + key + "' must be true or false");
    return v && v->as_bool();
  }

  // rope_theta and rope_scaling at the top level, or transformers 5's rope_parameters.
  RopeSpec rope() const {
    const json::Value* params = field(root_, "rope_parameters");
    const json::Value& holder = params ? *params : root_;
    const std::string where = params ? "rope_parameters." : "";
    if (params && !params->is_object()) refuse("'rope_parameters' must be an object");
    constexpr double kDefaultTheta = 10000;  // transformers' default for these families
    RopeSpec r;
    r.theta = number(holder, "rope_theta", where, &kDefaultTheta);
    const json::Value* scaling = params ? params : field(root_, "rope_scaling");
    if (!scaling) return r;
    if (!scaling->is_object()) refuse("'rope_scaling' must be an object or null");
    const std::string prefix = params ? where : "rope_scaling.";
    const json::Value* type = field(*scaling, "rope_type");
    if (!type) type = field(*scaling, "type");
    const std::string name = type && type->is_string() ? type->as_string() : "default";
    if (name == "default") return r;
    if (name != "linear" && name != "llama3") {
      refuse("rope scaling '" + name + "' is not supported (default, linear, llama3)");
    }
    r.factor = number(*scaling, "factor", prefix);
    if (name == "linear") {
      r.scaling = RopeScaling::linear;
      return r;
    }
    r.scaling = RopeScaling::llama3;
    r.low_freq_factor = number(*scaling, "low_freq_factor", prefix);
    r.high_freq_factor = number(*scaling, "high_freq_factor", prefix);
    const double context = number(*scaling, "original_max_position_embeddings", prefix);
    if (context != static_cast<double>(static_cast<std::int64_t>(context)))
      refuse("'" + prefix + "original_max_position_embeddings' must be an integer");
    r.original_context = static_cast<std::int64_t>(context);
    return r;
  }

 private:
  const json::Value& root_;
  const std::string& path_;
};

}  // namespace

ModelDims parse_model_config(std::string_view text, const std::string& path) {
  json::Value root;
  try {
    root = json::parse(text);
  } catch (const std::exception& e) {
    throw UsageError(path + ": not a JSON config file (" + e.what() + ")");
  }
  const ConfigReader c(root, path);
  if (!root.is_object()) c.refuse("not a config.json: the top level is not an object");
  const json::Value* type = c.field(root, "model_type");
  if (!type) c.refuse("missing field 'model_type'");
  if (!type->is_string()) c.refuse("'model_type' must be a string");
  const Family* family = nullptr;
  for (const Family& f : kFamilies) {
    if (type->as_string() == f.model_type) family = &f;
  }
  if (!family) {
    c.refuse("model_type '" + type->as_string() +
             "' is not supported (llama, qwen2, qwen3, qwen3_moe)");
  }
  if (c.flag("use_sliding_window")) c.refuse("sliding-window attention is not supported");
  constexpr double kFullRotary = 1;
  if (c.number(root, "partial_rotary_factor", "", &kFullRotary) != 1)
    c.refuse("partial_rotary_factor other than 1 is not supported");

  ModelDims m;
  m.hidden_size = c.integer("hidden_size");
  m.num_q_heads = c.integer("num_attention_heads");
  m.num_kv_heads = c.integer("num_key_value_heads", &m.num_q_heads);
  if (!c.field(root, "head_dim") && m.hidden_size % m.num_q_heads != 0) {
    c.refuse("hidden_size " + std::to_string(m.hidden_size) +
             " is not a multiple of num_attention_heads " + std::to_string(m.num_q_heads) +
             ", and there is no head_dim");
  }
  const int derived = m.hidden_size / m.num_q_heads;
  m.head_dim = m.rotary_dim = c.integer("head_dim", &derived);
  m.rope = c.rope();
  constexpr double kDefaultEps = 1e-6;
  m.rms_norm_eps = c.number(root, "rms_norm_eps", "", &kDefaultEps);
  m.vocab_size = c.integer("vocab_size");
  m.qk_norm = family->qk_norm;
  m.qkv_bias = family->qkv_bias_always || c.flag("attention_bias");
  m.name = type->as_string() + "-" + std::to_string(m.num_q_heads) + "q" +
           std::to_string(m.num_kv_heads) + "kv";
  m.source = path;
  if (const std::string why = model_problem(m); !why.empty()) c.refuse(why);
  return m;
}

ModelDims read_model_config(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw UsageError(path + ": cannot read the model config (not a file)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(path + ": cannot read the model config");
  std::ostringstream text;
  text << in.rdbuf();
  ModelDims m = parse_model_config(text.str(), path);
  m.source += " (sha256 " + sha256_hex(text.str()) + ")";
  return m;
}

}  // namespace cpd
