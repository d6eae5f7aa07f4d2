#include "core/models.h"

namespace cpd {

namespace {

struct Shape {
  int hidden, q_heads, kv_heads;
  double theta;
  double eps;
  int vocab;
};

// An entry: its name, the repository and revision its config.json was read at
// (docs/models.md), and its shape.
ModelDims qwen3(const char* name, const char* source, Shape s) {
  ModelDims m;
  m.name = name;
  m.source = source;
  m.hidden_size = s.hidden;
  m.num_q_heads = s.q_heads;
  m.num_kv_heads = s.kv_heads;
  m.head_dim = m.rotary_dim = 128;
  m.rope.theta = s.theta;
  m.rms_norm_eps = s.eps;
  m.vocab_size = s.vocab;
  return m;
}

std::vector<ModelDims> make_table() {
  std::vector<ModelDims> t;
  t.push_back(ModelDims{});  // qwen3-8b
  t.push_back(qwen3("qwen3-4b",
                    "huggingface.co/Qwen/Qwen3-4B@1cfa9a7208912126459214e8b04321603b3df60c",
                    {2560, 32, 8, 1e6, 1e-6, 151936}));
  t.push_back(qwen3("qwen3-14b",
                    "huggingface.co/Qwen/Qwen3-14B@40c069824f4251a91eefaf281ebe4c544efd3e18",
                    {5120, 40, 8, 1e6, 1e-6, 151936}));
  t.push_back(qwen3("qwen3-32b",
                    "huggingface.co/Qwen/Qwen3-32B@9216db5781bf21249d130ec9da846c4624c16137",
                    {5120, 64, 8, 1e6, 1e-6, 151936}));
  t.push_back(qwen3("qwen3-30b-a3b",
                    "huggingface.co/Qwen/Qwen3-30B-A3B@ad44e777bcd18fa416d9da3bd8f70d33ebb85d39",
                    {2048, 32, 4, 1e6, 1e-6, 151936}));
  ModelDims llama =
      qwen3("llama-3.1-8b",
            "huggingface.co/meta-llama/Llama-3.1-8B@d04e592bb4f6aa9cfee91e2e20afa771667e1d4b",
            {4096, 32, 8, 5e5, 1e-5, 128256});
  llama.qk_norm = false;
  llama.rope.scaling = RopeScaling::llama3;  // factor 8, low 1, high 4, original 8192
  llama.rope.factor = 8;
  llama.rope.low_freq_factor = 1;
  llama.rope.high_freq_factor = 4;
  llama.rope.original_context = 8192;
  t.push_back(llama);
  ModelDims qwen25 =
      qwen3("qwen2.5-7b", "huggingface.co/Qwen/Qwen2.5-7B@d149729398750b98c0af14eb82c78cfe92750796",
            {3584, 28, 4, 1e6, 1e-6, 152064});
  qwen25.qk_norm = false;
  qwen25.qkv_bias = true;
  t.push_back(qwen25);
  return t;
}

}  // namespace

const std::vector<ModelDims>& known_models() {
  static const std::vector<ModelDims> table = make_table();
  return table;
}

const ModelDims* find_model(std::string_view name) {
  for (const ModelDims& m : known_models()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::string known_model_names() {
  std::string names;
  for (const ModelDims& m : known_models()) names += (names.empty() ? "" : ", ") + m.name;
  return names;
}

std::string model_problem(const ModelDims& m) {
  const auto n = [](auto x) { return std::to_string(x); };
  if (m.num_q_heads < 1 || m.num_kv_heads < 1)
    return "the model needs at least one query and one KV head";
  if (m.num_q_heads % m.num_kv_heads != 0) {
    return n(m.num_kv_heads) + " KV heads do not divide the " + n(m.num_q_heads) +
           " query heads (GQA groups of equal size)";
  }
  // The CPU attention tiles (forward and backward) hold a row in 64-float steps.
  if (m.head_dim < 64 || m.head_dim % 64 != 0 || m.head_dim > kMaxHeadDim) {
    return "head dim " + n(m.head_dim) + ": the kernels take a multiple of 64 from 64 to " +
           n(kMaxHeadDim);
  }
  if (m.rotary_dim != m.head_dim) return "a rotary dim other than the head dim is not supported";
  if (!(m.rope.theta > 1)) return "rope_theta must be above 1";
  if (m.rope.scaling != RopeScaling::none && !(m.rope.factor >= 1)) {
    return "rope scaling factor must be at least 1";
  }
  if (m.rope.scaling == RopeScaling::llama3 &&
      !(m.rope.high_freq_factor > m.rope.low_freq_factor && m.rope.low_freq_factor > 0 &&
        m.rope.original_context > 0)) {
    return "llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and a positive "
           "original_max_position_embeddings";
  }
  if (m.vocab_size < 2) return "vocab_size must be at least 2";
  return "";
}

}  // namespace cpd
