// A [B, H, S, D] tensor stored raw in a file (safetensors, .npy): row runs read with pread at
// their offsets and widened to FP32. Shared by the safetensors and .npy readers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/range.h"
#include "inputs/file_inputs.h"
#include "report/json.h"

namespace cpd::input_files {

enum class StoredType { f32, f16, bf16 };

/// Exact widening of one stored element to FP32.
float widen(StoredType type, const unsigned char* p);
int type_bytes(StoredType type);
const char* type_name(StoredType type);

/// An open file descriptor shared by the tensors of one file.
class RawFile {
 public:
  explicit RawFile(const std::string& path);
  ~RawFile();
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;
  /// Reads exactly `bytes` at `offset`; a short read is a std::runtime_error (the openers check
  /// sizes first, so it means the file changed under the run).
  void read(std::uint64_t offset, void* out, std::size_t bytes) const;
  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

struct RawTensor {
  std::shared_ptr<RawFile> file;
  std::uint64_t offset = 0;  // of element [0, 0, 0, 0]
  StoredType type = StoredType::f32;
  std::vector<std::int64_t> shape;  // [B, H, S, D], or [B, S, hidden]: one head
  /// Rows `tokens` of (b, h) into out ([tokens.size()][D]).
  void read_rows(int b, std::int64_t h, Range tokens, float* out) const;
};

/// Points `in`'s q, k and v readers at the three tensors and records their dtype (q's).
void use_raw_tensors(FileInputs& in, const RawTensor (&tensors)[3]);
/// Points `in`'s hidden reader at `hidden` ([B, S, hidden]) and records its dtype.
void use_raw_hidden(FileInputs& in, RawTensor hidden);

/// A safetensors file (an 8-byte little-endian header length N, N bytes of JSON {name: {dtype,
/// shape, data_offsets}}, then the tensors' bytes): its header, and where the bytes begin.
struct SafetensorsFile {
  std::shared_ptr<RawFile> file;
  json::Value header;
  std::uint64_t base = 0;
};
/// Opens `path` and reads its header; a file that is not safetensors is a UsageError
/// "PATH: `not_one`".
SafetensorsFile open_safetensors_file(const std::string& path, const std::string& not_one);
/// A tensor entry's shape, and where its `bytes` begin in the file (checked against its
/// data_offsets and the file's size); `where` names it in the UsageError.
std::vector<std::int64_t> shape_of(const json::Value& t, const std::string& where);
std::uint64_t offset_of(const json::Value& t, std::uint64_t base, std::uint64_t bytes,
                        const RawFile& file, const std::string& where);

/// `count` little-endian integers of `size` bytes (signed or not) at `offset` of `file`, as int64.
std::vector<std::int64_t> read_integers(const RawFile& file, std::uint64_t offset,
                                        std::size_t count, int size, bool is_signed);

}  // namespace cpd::input_files
