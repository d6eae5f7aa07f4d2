// Tensor dumps (`--dump PATH`): rank 0 writes global tensors piece by piece as they stream in.
// The HDF5 implementation lives in src/io/; a build without HDF5 refuses --dump up front.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "comm/global_tensor.h"

namespace cpd {

using DumpValue = std::variant<std::string, std::int64_t, double>;
using DumpAttributes = std::vector<std::pair<std::string, DumpValue>>;

/// "[1, 32, 16, 128]": a tensor's extents as messages and tables print them.
inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

class TensorDump {
 public:
  virtual ~TensorDump() = default;
  /// Attributes of a group ("/", "/cases/<case>", …), created when missing.
  virtual void annotate(const std::string& group, const DumpAttributes& attributes) = 0;
  /// Starts dataset `path` (FP32, `dims`) with its attributes; pieces follow, then end().
  virtual void begin(const std::string& path, const std::vector<std::int64_t>& dims,
                     const DumpAttributes& attributes) = 0;
  /// A text dataset (e.g. the JSON report): too large for an attribute, which HDF5 keeps
  /// under 64 KiB.
  virtual void write_text(const std::string& path, const std::string& text) = 0;
  /// Rows of one (b, h, token range) piece: [tokens][width] at [b, h, tokens, :].
  virtual void write(const GlobalPiece& piece, const float* rows) = 0;
  virtual void end() = 0;
  /// Closes the file and renames it from its temporary name into place.
  virtual void commit() = 0;
};

/// True when this build can write dumps.
bool dump_supported();

/// Opens `path` for writing under a temporary name in the same directory (renamed by
/// commit(); removed when the dump is destroyed uncommitted). Throws UsageError when built
/// without HDF5, std::runtime_error when the file cannot be created.
std::unique_ptr<TensorDump> open_tensor_dump(const std::string& path);

/// `inner` whose `when`-th write() of a piece (from 1) fails as a refused HDF5 write does
/// (`--inject-fault dump-write-error@0:WHEN`, a test aid); commit() fails when it never did, so
/// a fault that was not injected cannot pass for one that was handled.
std::unique_ptr<TensorDump> with_write_fault(std::unique_ptr<TensorDump> inner,
                                             const std::string& path, int when);

}  // namespace cpd
