// A directory of .npy files: q.npy, k.npy, v.npy (float32 or float16, C order), optional
// positions.npy (integers, [B, S]), and inputs.json {"rope_applied": true|false}; or, for the
// layer, hidden.npy [B, S, hidden] and optional positions.npy (no inputs.json needed).
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/errors.h"
#include "core/util/npy_format.h"
#include "inputs/file_inputs.h"
#include "inputs/raw_tensor.h"
#include "report/json.h"

namespace cpd::input_files {
namespace {

// The header of a .npy file, checked against the file's size.
NpyHeader header_of(const RawFile& file) {
  std::string head(static_cast<std::size_t>(std::min<std::uint64_t>(file.size(), 1 << 16)), '\0');
  file.read(0, head.data(), head.size());
  NpyHeader h;
  try {
    h = parse_npy_header(head);
  } catch (const std::runtime_error& e) {
    throw UsageError(file.path() + ": " + e.what());
  }
  if (file.size() != h.data_offset + h.data_bytes()) {
    throw UsageError(file.path() + ": " + std::to_string(file.size() - h.data_offset) +
                     " bytes of data, shape " + h.shape_text() + " needs " +
                     std::to_string(h.data_bytes()) + " (truncated or not this shape)");
  }
  return h;
}

// `p`, a float32 or float16 .npy file, as a RawTensor of its shape.
RawTensor float_tensor(const std::filesystem::path& p) {
  RawTensor r;
  r.file = std::make_shared<RawFile>(p.string());
  const NpyHeader h = header_of(*r.file);
  if (h.kind != 'f' || h.itemsize == 8)
    throw UsageError(p.string() +
                     ": must hold float32 or float16 (a bfloat16 file: HDF5 or safetensors)");
  r.type = h.itemsize == 4 ? StoredType::f32 : StoredType::f16;
  r.shape = h.shape;
  r.offset = h.data_offset;
  return r;
}

// q.npy, k.npy, v.npy and inputs.json's rope_applied.
void open_qkv(const std::string& path, const ModelDims& dims, FileInputs& in) {
  namespace fs = std::filesystem;
  const fs::path dir(path);
  const fs::path meta = dir / "inputs.json";
  std::ifstream m(meta);
  if (!m) {
    throw UsageError(path +
                     ": no inputs.json saying {\"rope_applied\": true|false} (are q and k "
                     "stored after RoPE?)");
  }
  std::ostringstream text;
  text << m.rdbuf();
  json::Value v;
  try {
    v = json::parse(text.str());
  } catch (const std::exception& e) {
    throw UsageError(meta.string() + ": not JSON (" + e.what() + ")");
  }
  if (!v.is_object() || !v.contains("rope_applied") || !v.at("rope_applied").is_bool())
    throw UsageError(meta.string() + ": needs {\"rope_applied\": true|false}");
  in.file.rope_applied = v.at("rope_applied").as_bool();

  RawTensor tensors[3];
  const char* names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const fs::path p = dir / (std::string(names[i]) + ".npy");
    if (!fs::exists(p)) throw UsageError(path + ": no " + names[i] + ".npy");
    tensors[i] = float_tensor(p);
  }
  check_shapes(path, tensors[0].shape, tensors[1].shape, tensors[2].shape, dims, in.file);
  use_raw_tensors(in, tensors);
}

}  // namespace

void open_npy_directory(const std::string& path, const ModelDims& dims, bool layer,
                        FileInputs& in) {
  namespace fs = std::filesystem;
  const fs::path dir(path);
  const bool has_qkv = fs::exists(dir / "q.npy"), has_hidden = fs::exists(dir / "hidden.npy");
  check_kind(path, layer, has_qkv, has_hidden);
  if (layer) {
    RawTensor hidden = float_tensor(dir / "hidden.npy");
    check_hidden_shape(path, hidden.shape, dims, in.file);
    use_raw_hidden(in, std::move(hidden));
  } else {
    open_qkv(path, dims, in);
  }

  const fs::path pos = dir / "positions.npy";
  if (fs::exists(pos)) {
    const RawFile file(pos.string());
    const NpyHeader h = header_of(file);
    if (h.kind != 'i' && h.kind != 'u') throw UsageError(pos.string() + ": must hold integers");
    const std::size_t count = h.data_bytes() / static_cast<std::size_t>(h.itemsize);
    use_positions(pos.string(), h.shape,
                  read_integers(file, h.data_offset, count, h.itemsize, h.kind == 'i'), in);
  }
}

}  // namespace cpd::input_files
