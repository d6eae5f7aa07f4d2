// safetensors: an 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {string: string}}), then the tensors' bytes, each
// at 8 + N + begin, row-major, little-endian.
#include <memory>
#include <string>

#include "core/errors.h"
#include "inputs/file_inputs.h"
#include "inputs/raw_tensor.h"
#include "report/json.h"

namespace cpd::input_files {

namespace {
constexpr std::uint64_t kMaxHeader = 100u << 20;  // what the safetensors format itself allows
}  // namespace

std::vector<std::int64_t> shape_of(const json::Value& t, const std::string& where) {
  std::vector<std::int64_t> shape;
  if (!t.contains("shape") || !t.at("shape").is_array()) throw UsageError(where + ": no shape");
  for (const json::Value& d : t.at("shape").as_array()) {
    if (!d.is_integer() || d.as_double() < 0) throw UsageError(where + ": bad shape");
    shape.push_back(d.as_int64());
  }
  return shape;
}

std::uint64_t offset_of(const json::Value& t, std::uint64_t base, std::uint64_t bytes,
                        const RawFile& file, const std::string& where) {
  const json::Value& o = t.contains("data_offsets") ? t.at("data_offsets") : json::Value();
  if (!o.is_array() || o.size() != 2 || !o.at(0).is_integer() || !o.at(1).is_integer())
    throw UsageError(where + ": no data_offsets [begin, end]");
  const std::uint64_t begin = o.at(0).as_uint64(), end = o.at(1).as_uint64();
  if (end < begin || end - begin != bytes) {
    throw UsageError(where + ": data_offsets hold " + std::to_string(end - begin) +
                     " bytes, its shape and dtype need " + std::to_string(bytes));
  }
  if (base + end > file.size()) {
    throw UsageError(where + ": ends at byte " + std::to_string(base + end) + ", the file has " +
                     std::to_string(file.size()) + " (truncated?)");
  }
  return base + begin;
}

SafetensorsFile open_safetensors_file(const std::string& path, const std::string& not_one) {
  SafetensorsFile f{std::make_shared<RawFile>(path), json::Value(), 0};
  const RawFile& file = *f.file;
  if (file.size() < 8) throw UsageError(path + ": " + not_one);
  const auto n = static_cast<std::uint64_t>(read_integers(file, 0, 1, 8, false)[0]);
  if (n < 2 || n > kMaxHeader || 8 + n > file.size()) {
    throw UsageError(path + ": " + not_one + " (a safetensors header of " + std::to_string(n) +
                     " bytes in a file of " + std::to_string(file.size()) + ")");
  }
  std::string text(n, '\0');
  file.read(8, text.data(), n);
  try {
    f.header = json::parse(text);
  } catch (const std::exception& e) {
    throw UsageError(path + ": safetensors header is not JSON (" + e.what() + ")");
  }
  if (!f.header.is_object()) throw UsageError(path + ": safetensors header is not a JSON object");
  f.base = 8 + n;
  return f;
}

namespace {

// Tensor `name`'s dtype and shape (its bytes are placed once the shapes are checked).
RawTensor tensor_entry(const json::Value& header, const std::string& path, const char* name) {
  const std::string where = path + ": tensor " + name;
  if (!header.contains(name)) throw UsageError(path + ": no tensor \"" + name + "\"");
  const json::Value& t = header.at(name);
  if (!t.is_object() || !t.contains("dtype") || !t.at("dtype").is_string())
    throw UsageError(where + ": no dtype");
  const std::string dtype = t.at("dtype").as_string();
  if (dtype != "F32" && dtype != "F16" && dtype != "BF16")
    throw UsageError(where + ": dtype " + dtype + " (reads F32, F16 and BF16)");
  RawTensor r;
  r.type = dtype == "F32" ? StoredType::f32 : dtype == "F16" ? StoredType::f16 : StoredType::bf16;
  r.shape = shape_of(t, where);
  return r;
}

// Where tensor `name` (`r`, its shape checked) begins in the file.
void place(RawTensor& r, const SafetensorsFile& st, const std::string& path, const char* name) {
  std::uint64_t count = 1;
  for (const std::int64_t d : r.shape) count *= static_cast<std::uint64_t>(d);
  r.file = st.file;
  r.offset = offset_of(st.header.at(name), st.base, count * type_bytes(r.type), *st.file,
                       path + ": tensor " + name);
}

}  // namespace

void open_safetensors(const std::string& path, const ModelDims& dims, bool layer, FileInputs& in) {
  const SafetensorsFile st =
      open_safetensors_file(path, "not HDF5, safetensors or a .npy directory");
  const std::shared_ptr<RawFile>& file = st.file;
  const json::Value& header = st.header;
  const std::uint64_t base = st.base;
  const bool has_qkv = header.contains("q"), has_hidden = header.contains("hidden");
  check_kind(path, layer, has_qkv, has_hidden);

  if (layer) {  // the layer applies RoPE itself: no rope_applied to say
    RawTensor hidden = tensor_entry(header, path, "hidden");
    check_hidden_shape(path, hidden.shape, dims, in.file);
    place(hidden, st, path, "hidden");
    use_raw_hidden(in, std::move(hidden));
  } else {
    // RoPE: stated in the metadata, or the file is refused.
    const json::Value* meta =
        header.contains("__metadata__") ? &header.at("__metadata__") : nullptr;
    if (meta == nullptr || !meta->is_object() || !meta->contains("rope_applied") ||
        !meta->at("rope_applied").is_string()) {
      throw UsageError(path +
                       ": __metadata__ must say \"rope_applied\": \"true\" or \"false\" "
                       "(are q and k stored after RoPE?)");
    }
    const std::string rope = meta->at("rope_applied").as_string();
    if (rope != "true" && rope != "false" && rope != "1" && rope != "0")
      throw UsageError(path + ": __metadata__ rope_applied is \"" + rope + "\", not true or false");
    in.file.rope_applied = rope == "true" || rope == "1";

    const char* names[3] = {"q", "k", "v"};
    RawTensor tensors[3];
    for (int i = 0; i < 3; ++i) tensors[i] = tensor_entry(header, path, names[i]);
    check_shapes(path, tensors[0].shape, tensors[1].shape, tensors[2].shape, dims, in.file);
    for (int i = 0; i < 3; ++i) place(tensors[i], st, path, names[i]);
    use_raw_tensors(in, tensors);
  }

  if (header.contains("positions")) {
    const json::Value& t = header.at("positions");
    const std::string where = path + ": tensor positions";
    const std::string dtype = t.contains("dtype") && t.at("dtype").is_string()
                                  ? t.at("dtype").as_string()
                                  : std::string();
    if (dtype != "I64" && dtype != "I32") throw UsageError(where + ": dtype must be I64 or I32");
    const std::vector<std::int64_t> shape = shape_of(t, where);
    const std::uint64_t count =
        shape.size() == 2 ? static_cast<std::uint64_t>(shape[0] * shape[1]) : 0;
    const int size = dtype == "I64" ? 8 : 4;
    const std::uint64_t at = offset_of(t, base, count * size, *file, where);
    use_positions(path, shape, read_integers(*file, at, count, size, true), in);
  }
}

}  // namespace cpd::input_files
