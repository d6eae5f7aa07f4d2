// The InputSource of an input file, whatever its format: one row reader per tensor, the file's
// RoPE positions, and what the report records. Each format's opener (hdf5_inputs.cpp,
// safetensors_inputs.cpp, npy_inputs.cpp) fills one.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/input_source.h"
#include "core/model.h"

namespace cpd::input_files {

using RowReader = std::function<void(int b, std::int64_t h, Range tokens, float* out)>;

class FileInputs : public InputSource {
 public:
  RowReader q, k, v, hidden;            // hidden: in a file of the layer's hidden states (h is 0)
  std::vector<std::int64_t> positions;  // [B][S], empty: the token index
  InputFileInfo file;

  void read_rows(TensorId tensor, int b, std::int64_t h, Range tokens, float* out) const override {
    const RowReader& r = tensor == TensorId::hidden ? hidden
                         : tensor == TensorId::q    ? q
                         : tensor == TensorId::k    ? k
                                                    : v;
    r(b, h, tokens, out);
  }
  std::int64_t rope_position(int b, std::int64_t pos) const override {
    return positions.empty() ? pos : positions[static_cast<std::size_t>(b * file.seq_len + pos)];
  }
  const InputFileInfo& info() const override { return file; }
};

/// Checks the three shapes against the model (q [B, Hq, S, D], k and v [B, Hkv, S, D], one B and
/// S) and sets file.batch and file.seq_len; a UsageError naming `path` and the tensor otherwise.
void check_shapes(const std::string& path, const std::vector<std::int64_t>& q,
                  const std::vector<std::int64_t>& k, const std::vector<std::int64_t>& v,
                  const ModelDims& dims, InputFileInfo& file);

/// Checks hidden's shape against the model ([B, S, hidden_size]) and sets file.batch,
/// file.seq_len and file.hidden; a UsageError naming `path` otherwise.
void check_hidden_shape(const std::string& path, const std::vector<std::int64_t>& shape,
                        const ModelDims& dims, InputFileInfo& file);

/// A UsageError when the file lacks the tensors `layer` needs (the layer's hidden, or the core's
/// q, k, v) — saying which the run reads and, when the file holds the other kind, which --scope
/// reads it. A file of neither kind passes: the core's opener names the tensor it misses.
void check_kind(const std::string& path, bool layer, bool has_qkv, bool has_hidden);

/// Checks positions' shape [B, S] and that every value is ≥ 0 and < 2^24 (exact as FP32, which
/// RoPE's angle needs), then makes them `in`'s RoPE positions.
void use_positions(const std::string& path, const std::vector<std::int64_t>& shape,
                   std::vector<std::int64_t> values, FileInputs& in);

/// Each format's opener: q, k and v, or (`layer`) hidden, and the positions when the file has
/// them.
void open_hdf5(const std::string& path, const ModelDims& dims, bool layer, FileInputs& in);
void open_safetensors(const std::string& path, const ModelDims& dims, bool layer, FileInputs& in);
void open_npy_directory(const std::string& path, const ModelDims& dims, bool layer, FileInputs& in);

}  // namespace cpd::input_files
