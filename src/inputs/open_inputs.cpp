#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/errors.h"
#include "core/util/sha256.h"
#include "inputs/file_inputs.h"
#include "inputs/input_files.h"
#include "io/tensor_dump.h"

namespace cpd {
namespace input_files {

void check_shapes(const std::string& path, const std::vector<std::int64_t>& q,
                  const std::vector<std::int64_t>& k, const std::vector<std::int64_t>& v,
                  const ModelDims& dims, InputFileInfo& file) {
  const auto check = [&](const char* name, const std::vector<std::int64_t>& s, int heads) {
    const bool ok = s.size() == 4 && s[0] >= 1 && s[1] == heads && s[2] >= 1 &&
                    s[3] == dims.head_dim && s[0] == q[0] && s[2] == q[2];
    if (!ok) {
      throw UsageError(path + ": " + name + " has shape " + shape_text(s) + "; " + dims.name +
                       " needs [B, " + std::to_string(heads) + ", S, " +
                       std::to_string(dims.head_dim) + "]" +
                       (q.size() == 4 && name[0] != 'q' ? " with q's B and S" : ""));
    }
  };
  check("q", q, dims.num_q_heads);
  check("k", k, dims.num_kv_heads);
  check("v", v, dims.num_kv_heads);
  if (q[0] > (1 << 20)) throw UsageError(path + ": B = " + std::to_string(q[0]) + " sequences");
  file.batch = static_cast<int>(q[0]);
  file.seq_len = q[2];
}

void check_hidden_shape(const std::string& path, const std::vector<std::int64_t>& shape,
                        const ModelDims& dims, InputFileInfo& file) {
  if (shape.size() != 3 || shape[0] < 1 || shape[1] < 1 || shape[2] != dims.hidden_size) {
    throw UsageError(path + ": hidden has shape " + shape_text(shape) + "; " + dims.name +
                     " needs [B, S, " + std::to_string(dims.hidden_size) + "]");
  }
  if (shape[0] > (1 << 20))
    throw UsageError(path + ": B = " + std::to_string(shape[0]) + " sequences");
  file.batch = static_cast<int>(shape[0]);
  file.seq_len = shape[1];
  file.hidden = true;
}

void check_kind(const std::string& path, bool layer, bool has_qkv, bool has_hidden) {
  if (layer && !has_hidden) {
    throw UsageError(path +
                     ": no hidden [B, S, hidden]: --scope layer reads the layer's hidden states" +
                     (has_qkv ? " (this file holds the core's q, k, v: drop --scope layer)" : ""));
  }
  // A core file without q: refused here when it is the layer's, else by the opener naming q.
  if (!layer && !has_qkv && has_hidden)
    throw UsageError(path +
                     ": no q, k, v (this file holds the layer's hidden states: add --scope layer)");
}

void use_positions(const std::string& path, const std::vector<std::int64_t>& shape,
                   std::vector<std::int64_t> values, FileInputs& in) {
  const InputFileInfo& file = in.file;
  if (shape.size() != 2 || shape[0] != file.batch || shape[1] != file.seq_len) {
    throw UsageError(path + ": positions has shape " + shape_text(shape) + "; needs [" +
                     std::to_string(file.batch) + ", " + std::to_string(file.seq_len) + "]");
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 0 || values[i] >= (std::int64_t{1} << 24)) {
      throw UsageError(path + ": positions[" + std::to_string(i / file.seq_len) + ", " +
                       std::to_string(i % file.seq_len) + "] = " + std::to_string(values[i]) +
                       " (must be in [0, 2^24))");
    }
  }
  in.positions = std::move(values);
  in.file.positions = true;
}

}  // namespace input_files

std::shared_ptr<const InputSource> open_input_file(const std::string& path, const ModelDims& dims,
                                                   bool layer, bool fingerprint) {
  namespace fs = std::filesystem;
  using namespace input_files;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw UsageError("--inputs " + path + ": no such file or directory");
  auto in = std::make_shared<FileInputs>();
  in->file.path = path;
  std::vector<std::string> files{path};
  if (fs::is_directory(st)) {
    in->file.format = "npy";
    open_npy_directory(path, dims, layer, *in);
    // Every file the directory's inputs are read from, in a fixed order.
    files.clear();
    const std::vector<const char*> names =
        layer ? std::vector<const char*>{"inputs.json", "hidden.npy", "positions.npy"}
              : std::vector<const char*>{"inputs.json", "q.npy", "k.npy", "v.npy", "positions.npy"};
    for (const char* name : names) {
      const fs::path f = fs::path(path) / name;
      if (fs::exists(f, ec)) files.push_back(f.string());
    }
  } else {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr)
      throw UsageError("--inputs " + path + ": cannot read: " + std::strerror(errno));
    char magic[8] = {};
    const bool hdf5 = std::fread(magic, 1, sizeof magic, f) == sizeof magic &&
                      std::memcmp(magic, "\x89HDF\r\n\x1a\n", 8) == 0;
    std::fclose(f);
    in->file.format = hdf5 ? "hdf5" : "safetensors";
    hdf5 ? open_hdf5(path, dims, layer, *in) : open_safetensors(path, dims, layer, *in);
  }
  for (const std::string& f : files) in->file.size_bytes += fs::file_size(f, ec);
  if (fingerprint) in->file.sha256 = sha256_files(files).sha256;
  return in;
}

}  // namespace cpd
