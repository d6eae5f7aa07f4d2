// --weights: a layer read from a Hugging Face checkpoint (sharded with an index, or one file) lands
// in LayerWeights element for element — each q, k, v head's rows, each head group's o_proj
// columns, the biases and norms — and every bad checkpoint is refused with one line naming it.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/errors.h"
#include "inputs/layer_checkpoint.h"
#include "temp_dir.h"

using namespace cpd;
using testing::TempDir;

namespace {

ModelDims small_dims() {
  ModelDims d;
  d.name = "test-layer";
  d.hidden_size = 96;
  d.num_q_heads = 8;
  d.num_kv_heads = 4;
  d.head_dim = 64;
  d.rotary_dim = 64;
  d.qk_norm = true;
  d.qkv_bias = true;
  return d;
}

// Element (r, c) of tensor `salt`: a small integer, exact in BF16, different for every
// neighbour, so a misplaced row or column shows.
float value(int salt, std::int64_t r, std::int64_t c) {
  return static_cast<float>((r * 31 + c * 7 + salt * 13) % 255 - 127);
}

struct Tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  int salt = 0;
  std::string dtype = "BF16";
};

// A safetensors file of `tensors`, each filled with value(salt, r, c) (a vector: r = 0).
std::string safetensors(const std::vector<Tensor>& tensors) {
  std::string header = "{", data;
  for (const Tensor& t : tensors) {
    const std::int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1, cols = t.shape.back();
    const int bytes = t.dtype == "F32" ? 4 : 2;
    const std::size_t begin = data.size();
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const float x = value(t.salt, r, c);
        std::uint32_t bits;
        std::memcpy(&bits, &x, 4);
        if (bytes == 2) bits >>= 16;
        data.append(reinterpret_cast<const char*>(&bits), static_cast<std::size_t>(bytes));
      }
    }
    std::string shape;
    for (const std::int64_t e : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(e);
    header += (header.size() > 1 ? "," : "") + std::string("\"") + t.name + "\":{\"dtype\":\"" +
              t.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(begin) +
              "," + std::to_string(data.size()) + "]}";
  }
  header += "}";
  const std::uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

// Layer `layer`'s tensors of `d`; salts 1…9 in the order q, k, v, o, q_norm, k_norm, biases.
std::vector<Tensor> layer_tensors(const ModelDims& d, int layer) {
  const std::int64_t q = d.num_q_heads * d.head_dim, kv = d.num_kv_heads * d.head_dim;
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  return {{p + "q_proj.weight", {q, d.hidden_size}, 1},
          {p + "k_proj.weight", {kv, d.hidden_size}, 2},
          {p + "v_proj.weight", {kv, d.hidden_size}, 3},
          {p + "o_proj.weight", {d.hidden_size, q}, 4},
          {p + "q_norm.weight", {d.head_dim}, 5},
          {p + "k_norm.weight", {d.head_dim}, 6},
          {p + "q_proj.bias", {q}, 7},
          {p + "k_proj.bias", {kv}, 8},
          {p + "v_proj.bias", {kv}, 9}};
}

// A sharded checkpoint: layer 1's projections in shard 1, the rest of it in shard 2, layer 0's
// q_proj in shard 1; `edit` changes layer 1's tensors before they are written.
void write_sharded(const TempDir& dir, const ModelDims& d,
                   void (*edit)(std::vector<Tensor>&) = nullptr) {
  std::vector<Tensor> one = layer_tensors(d, 1);
  if (edit) edit(one);
  std::vector<Tensor> a{layer_tensors(d, 0)[0]}, b;
  for (std::size_t i = 0; i < one.size(); ++i) (i < 3 ? a : b).push_back(one[i]);
  dir.write("model-00001-of-00002.safetensors", safetensors(a));
  dir.write("model-00002-of-00002.safetensors", safetensors(b));
  std::string map;
  for (const auto* shard : {&a, &b}) {
    for (const Tensor& t : *shard) {
      map += (map.empty() ? "" : ",") + std::string("\"") + t.name + "\":\"model-0000" +
             (shard == &a ? "1" : "2") + "-of-00002.safetensors\"";
    }
  }
  dir.write("model.safetensors.index.json", "{\"metadata\":{},\"weight_map\":{" + map + "}}");
}

// Every element LayerWeights holds against value().
int misplaced(const LayerWeights& w, const ModelDims& d) {
  const std::int64_t D = d.head_dim, hidden = d.hidden_size, G = d.group_size() * D;
  int bad = 0;
  const std::map<TensorId, int> salt{{TensorId::q, 1}, {TensorId::k, 2}, {TensorId::v, 3}};
  for (const auto& [t, s] : salt) {
    for (std::int64_t h = 0; h < heads_of(d, t); ++h) {
      const float* rows = w.projection(t, h);
      const float* bias = w.bias(t, h);
      for (std::int64_t r = 0; r < D; ++r) {
        for (std::int64_t c = 0; c < hidden; ++c)
          bad += rows[r * hidden + c] != value(s, h * D + r, c);
        bad += bias[r] != value(s + 6, 0, h * D + r);
      }
    }
  }
  for (std::int64_t g = 0; g < d.num_kv_heads; ++g) {
    const float* cols = w.o_proj_group(g);
    for (std::int64_t o = 0; o < hidden; ++o) {
      for (std::int64_t j = 0; j < G; ++j) bad += cols[o * G + j] != value(4, o, g * G + j);
    }
  }
  for (std::int64_t e = 0; e < D; ++e) {
    bad += w.norm(TensorId::q)[e] != value(5, 0, e);
    bad += w.norm(TensorId::k)[e] != value(6, 0, e);
  }
  return bad;
}

}  // namespace

TEST_CASE("--weights: a sharded checkpoint's layer, element for element") {
  const ModelDims d = small_dims();
  TempDir dir("cpdrift_ckpt");
  write_sharded(dir, d);
  const LayerWeights w(d, open_layer_checkpoint(dir.path.string(), 1, d));
  CHECK(misplaced(w, d) == 0);
  CHECK(w.source() == dir.path.string() + ", layer 1");
  // The control: a checkpoint whose q_proj holds other values is seen to differ.
  TempDir other("cpdrift_ckpt");
  write_sharded(other, d, [](std::vector<Tensor>& t) { t[0].salt = 2; });
  CHECK(misplaced(LayerWeights(d, open_layer_checkpoint(other.path.string(), 1, d)), d) > 0);
}

TEST_CASE("--weights: one safetensors file, as a directory's model.safetensors or by its path") {
  const ModelDims d = small_dims();
  TempDir dir("cpdrift_ckpt");
  const std::string file = dir.write("model.safetensors", safetensors(layer_tensors(d, 1)));
  for (const std::string& path : {dir.path.string(), file}) {
    const LayerWeights w(d, open_layer_checkpoint(path, 1, d));
    CHECK(misplaced(w, d) == 0);
  }
}

TEST_CASE("--weights: a bad checkpoint is refused with one line naming what is wrong") {
  const ModelDims d = small_dims();
  const auto refused = [&](void (*edit)(std::vector<Tensor>&), int layer, const char* expect) {
    TempDir dir("cpdrift_ckpt");
    write_sharded(dir, d, edit);
    CAPTURE(expect);
    CHECK_THROWS_WITH_AS(open_layer_checkpoint(dir.path.string(), layer, d),
                         doctest::Contains(expect), UsageError);
  };
  refused(nullptr, 5, "no layer 5 (it has layers 0 to 1)");
  refused([](std::vector<Tensor>& t) { t[0].dtype = "F32"; }, 1,
          "q_proj.weight: dtype F32, not the model's BF16");
  refused(
      [](std::vector<Tensor>& t) {
        t[1].shape = {64, 96};
      },
      1, "k_proj.weight: shape [64, 96], test-layer needs [256, 96]");
  refused([](std::vector<Tensor>& t) { t[5].name += "x"; }, 1,
          "no tensor model.layers.1.self_attn.k_norm.weight");
  TempDir dir("cpdrift_ckpt");
  write_sharded(dir, d);
  std::filesystem::remove(dir.path / "model-00002-of-00002.safetensors");
  CHECK_THROWS_WITH_AS(open_layer_checkpoint(dir.path.string(), 1, d),
                       doctest::Contains("model-00002-of-00002.safetensors: missing (the index "
                                         "names it for model.layers.1.self_attn.o_proj.weight)"),
                       UsageError);
  CHECK_THROWS_WITH_AS(open_layer_checkpoint((dir.path / "nothing").string(), 1, d),
                       doctest::Contains("cannot read"), UsageError);
}
