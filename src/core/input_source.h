// Inputs read from a file (`--inputs PATH`, docs/inputs.md): what input generation takes instead
// of the counter-based generator for q, k and v, or for the layer's hidden states (--scope layer).
// The readers (HDF5, safetensors, .npy) live above this layer; generate_shard sees only this
// interface, so every case, path and topology reads the same global tensors, each process only the
// rows it owns.
#pragma once

#include <cstdint>
#include <string>

#include "core/range.h"
#include "cpdrift/philox.h"

namespace cpd {

/// What the report records of an input file.
struct InputFileInfo {
  std::string path, format;  // format: "hdf5", "safetensors" or "npy"
  std::string dtype;         // as stored: "float32", "float16" or "bfloat16"
  std::uint64_t size_bytes = 0;
  std::string sha256;  // of the file (of its files in a fixed order for a .npy directory)
  bool rope_applied = false;
  bool positions = false;  // the file gives RoPE positions
  bool hidden = false;     // the layer's hidden states [B, S, hidden], not the core's q, k, v
  int batch = 0;
  std::int64_t seq_len = 0;
};

class InputSource {
 public:
  virtual ~InputSource() = default;
  /// Rows `tokens` of (tensor, sequence b, global head h), widened exactly to FP32, into `out`
  /// ([tokens.size()][head_dim]). Tensor is q, k or v; or hidden (h = 0, rows of hidden_size) in
  /// a file of hidden states. Safe to call from several threads.
  virtual void read_rows(TensorId tensor, int b, std::int64_t h, Range tokens,
                         float* out) const = 0;
  /// The RoPE position of token `pos` of sequence b (the file's positions, else pos).
  virtual std::int64_t rope_position(int b, std::int64_t pos) const = 0;
  virtual const InputFileInfo& info() const = 0;
};

}  // namespace cpd
