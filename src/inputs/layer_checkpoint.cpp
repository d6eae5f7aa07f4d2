#include "inputs/layer_checkpoint.h"

#include <sys/stat.h>

#include <map>
#include <set>
#include <vector>

#include "core/errors.h"
#include "inputs/raw_tensor.h"

namespace cpd {
namespace {

using input_files::RawFile;
using input_files::SafetensorsFile;

constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kNotSafetensors = "not a safetensors file";

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// A tensor of the layer, where its BF16 bytes are.
struct Stored {
  std::shared_ptr<RawFile> file;
  std::uint64_t offset = 0;
  std::int64_t columns = 0;  // elements of a row ([out][in]: in; a vector: its length)
};

class CheckpointLayer final : public LayerWeightSource {
 public:
  CheckpointLayer(std::string what, const ModelDims& dims, std::map<int, Stored> tensors)
      : what_(std::move(what)), dims_(dims), tensors_(std::move(tensors)) {}

  std::string describe() const override { return what_; }

  void fill(TensorId tensor, std::int64_t index, float* out) const override {
    const Stored& s = tensors_.at(static_cast<int>(tensor));
    const std::int64_t d = dims_.head_dim;
    switch (tensor) {
      case TensorId::q_proj:
      case TensorId::k_proj:
      case TensorId::v_proj:  // rows index·D … (index + 1)·D, whole
        read(s, index * d * s.columns, d * s.columns, out);
        break;
      case TensorId::o_proj: {  // each row's columns of group `index`
        const std::int64_t g = dims_.group_size() * d;
        for (std::int64_t o = 0; o < dims_.hidden_size; ++o)
          read(s, o * s.columns + index * g, g, out + o * g);
        break;
      }
      case TensorId::q_norm:
      case TensorId::k_norm:
        read(s, 0, d, out);
        break;
      default:  // a head's bias
        read(s, index * d, d, out);
    }
  }

 private:
  // n BF16 elements from element `first` on, widened to FP32 (exact).
  static void read(const Stored& s, std::int64_t first, std::int64_t n, float* out) {
    std::vector<unsigned char> bytes(static_cast<std::size_t>(2 * n));
    s.file->read(s.offset + static_cast<std::uint64_t>(2 * first), bytes.data(), bytes.size());
    for (std::int64_t i = 0; i < n; ++i)
      out[i] = input_files::widen(input_files::StoredType::bf16, bytes.data() + 2 * i);
  }

  std::string what_;
  ModelDims dims_;
  std::map<int, Stored> tensors_;
};

// The checkpoint's files by tensor name: the index's weight_map, or the one file's header.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path) : path_(path) {
    std::string single = path;
    if (is_directory(path)) {
      const std::string index = path + "/" + kIndex;
      if (exists(index)) {
        read_index(index);
        return;
      }
      single = path + "/model.safetensors";
      if (!exists(single))
        throw UsageError(path + ": neither " + kIndex + " nor model.safetensors in it");
    }
    const SafetensorsFile& f = file(single);
    for (const auto& [name, entry] : f.header.as_object()) {
      if (name != "__metadata__") names_[name] = single;
    }
  }

  /// The file holding `name` ("" when the checkpoint has no such tensor).
  std::string file_of(const std::string& name) const {
    const auto it = names_.find(name);
    return it == names_.end() ? std::string() : it->second;
  }
  /// The layers the checkpoint's names mention (model.layers.N.…).
  std::set<int> layers() const {
    std::set<int> out;
    const std::string prefix = "model.layers.";
    for (const auto& [name, f] : names_) {
      if (name.rfind(prefix, 0) != 0) continue;
      const std::size_t dot = name.find('.', prefix.size());
      const std::string n = name.substr(prefix.size(), dot - prefix.size());
      if (!n.empty() && n.find_first_not_of("0123456789") == std::string::npos)
        out.insert(std::stoi(n));
    }
    return out;
  }
  const SafetensorsFile& file(const std::string& path) {
    auto it = files_.find(path);
    if (it == files_.end())
      it = files_.emplace(path, input_files::open_safetensors_file(path, kNotSafetensors)).first;
    return it->second;
  }

 private:
  void read_index(const std::string& index) {
    const RawFile raw(index);
    std::string text(raw.size(), '\0');
    raw.read(0, text.data(), text.size());
    json::Value v;
    try {
      v = json::parse(text);
    } catch (const std::exception& e) {
      throw UsageError(index + ": not JSON (" + e.what() + ")");
    }
    if (!v.is_object() || !v.contains("weight_map") || !v.at("weight_map").is_object())
      throw UsageError(index + ": no \"weight_map\" object");
    for (const auto& [name, f] : v.at("weight_map").as_object()) {
      if (!f.is_string()) throw UsageError(index + ": weight_map[\"" + name + "\"] is not a file");
      names_[name] = path_ + "/" + f.as_string();
    }
  }

  std::string path_;
  std::map<std::string, std::string> names_;
  std::map<std::string, SafetensorsFile> files_;
};

}  // namespace

std::shared_ptr<const LayerWeightSource> open_layer_checkpoint(const std::string& path, int layer,
                                                               const ModelDims& dims) {
  Checkpoint ckpt(path);
  const std::set<int> layers = ckpt.layers();
  if (layers.count(layer) == 0) {
    throw UsageError(path + ": no layer " + std::to_string(layer) +
                     (layers.empty() ? std::string(" (no model.layers.N tensors)")
                                     : " (it has layers " + std::to_string(*layers.begin()) +
                                           " to " + std::to_string(*layers.rbegin()) + ")"));
  }
  const std::string prefix = "model.layers." + std::to_string(layer) + ".self_attn.";
  const std::int64_t d = dims.head_dim, hidden = dims.hidden_size;
  const std::int64_t q = std::int64_t{dims.num_q_heads} * d,
                     kv = std::int64_t{dims.num_kv_heads} * d;
  struct Need {
    TensorId id;
    std::string name;
    std::vector<std::int64_t> shape;
  };
  std::vector<Need> needs{{TensorId::q_proj, "q_proj.weight", {q, hidden}},
                          {TensorId::k_proj, "k_proj.weight", {kv, hidden}},
                          {TensorId::v_proj, "v_proj.weight", {kv, hidden}},
                          {TensorId::o_proj, "o_proj.weight", {hidden, q}}};
  if (dims.qk_norm) {
    needs.push_back({TensorId::q_norm, "q_norm.weight", {d}});
    needs.push_back({TensorId::k_norm, "k_norm.weight", {d}});
  }
  if (dims.qkv_bias) {
    needs.push_back({TensorId::q_bias, "q_proj.bias", {q}});
    needs.push_back({TensorId::k_bias, "k_proj.bias", {kv}});
    needs.push_back({TensorId::v_bias, "v_proj.bias", {kv}});
  }
  const auto text = [](const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  };
  std::map<int, Stored> tensors;
  for (const Need& n : needs) {
    const std::string name = prefix + n.name;
    const std::string file = ckpt.file_of(name);
    if (file.empty()) throw UsageError(path + ": no tensor " + name);
    if (!exists(file)) throw UsageError(file + ": missing (the index names it for " + name + ")");
    const SafetensorsFile& f = ckpt.file(file);
    const std::string where = file + ": " + name;
    if (!f.header.contains(name)) throw UsageError(where + ": not in the file the index names");
    const json::Value& t = f.header.at(name);
    const std::string dtype =
        t.contains("dtype") && t.at("dtype").is_string() ? t.at("dtype").as_string() : "";
    if (dtype != "BF16")
      throw UsageError(where + ": dtype " + (dtype.empty() ? "missing" : dtype) +
                       ", not the model's BF16");
    const std::vector<std::int64_t> shape = input_files::shape_of(t, where);
    if (shape != n.shape) {
      throw UsageError(where + ": shape " + text(shape) + ", " + dims.name + " needs " +
                       text(n.shape));
    }
    std::uint64_t count = 1;
    for (const std::int64_t e : shape) count *= static_cast<std::uint64_t>(e);
    tensors[static_cast<int>(n.id)] =
        Stored{f.file, input_files::offset_of(t, f.base, 2 * count, *f.file, where), shape.back()};
  }
  return std::make_shared<const CheckpointLayer>(path + ", layer " + std::to_string(layer), dims,
                                                 std::move(tensors));
}

}  // namespace cpd
