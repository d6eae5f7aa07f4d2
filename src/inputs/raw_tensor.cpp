#include "inputs/raw_tensor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "core/errors.h"

namespace cpd::input_files {

float widen(StoredType type, const unsigned char* p) {
  const std::uint32_t half = std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8;
  std::uint32_t bits = half << 16;  // BF16: the high half of an FP32
  if (type == StoredType::f32) std::memcpy(&bits, p, 4);
  if (type == StoredType::f16) {
    const std::uint32_t exp = (half >> 10) & 0x1fu, man = half & 0x3ffu;
    if (exp != 0x1f) {
      // (1024 [exp > 0] + man) · 2^(max(exp, 1) − 25): a normal or subnormal, exact in FP32.
      const float x = std::ldexp(static_cast<float>(exp > 0 ? man | 0x400u : man),
                                 std::max<int>(static_cast<int>(exp), 1) - 25);
      return (half & 0x8000u) != 0 ? -x : x;
    }
    bits = (half & 0x8000u) << 16 | 0x7f800000u | man << 13;  // inf, NaN (its payload kept)
  }
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

int type_bytes(StoredType type) { return type == StoredType::f32 ? 4 : 2; }

const char* type_name(StoredType type) {
  return type == StoredType::f32 ? "float32" : type == StoredType::f16 ? "float16" : "bfloat16";
}

RawFile::RawFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw UsageError(path + ": cannot read: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw UsageError(path + ": cannot stat: " + std::strerror(errno));
  size_ = static_cast<std::uint64_t>(st.st_size);
}

RawFile::~RawFile() {
  if (fd_ >= 0) ::close(fd_);
}

void RawFile::read(std::uint64_t offset, void* out, std::size_t bytes) const {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // The openers check every size first: a short read is the file changing under the run.
      throw std::runtime_error(
          path_ + ": " +
          (n < 0 ? std::string(std::strerror(errno)) : "ends at byte " + std::to_string(offset)));
    }
    p += n;
    offset += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
}

void RawTensor::read_rows(int b, std::int64_t h, Range tokens, float* out) const {
  const bool per_head = shape.size() == 4;
  const std::int64_t heads = per_head ? shape[1] : 1, seq = shape[per_head ? 2 : 1],
                     dim = shape.back();
  const int size = type_bytes(type);
  const std::uint64_t first =
      static_cast<std::uint64_t>(((b * heads + h) * seq + tokens.begin) * dim);
  const std::size_t count = static_cast<std::size_t>(tokens.size() * dim);
  if (type == StoredType::f32) {
    file->read(offset + first * 4, out, count * 4);
    return;
  }
  std::vector<unsigned char> raw(count * static_cast<std::size_t>(size));
  file->read(offset + first * static_cast<std::uint64_t>(size), raw.data(), raw.size());
  for (std::size_t i = 0; i < count; ++i) out[i] = widen(type, raw.data() + i * size);
}

void use_raw_tensors(FileInputs& in, const RawTensor (&tensors)[3]) {
  in.file.dtype = type_name(tensors[0].type);
  in.q = std::bind_front(&RawTensor::read_rows, tensors[0]);
  in.k = std::bind_front(&RawTensor::read_rows, tensors[1]);
  in.v = std::bind_front(&RawTensor::read_rows, tensors[2]);
}

void use_raw_hidden(FileInputs& in, RawTensor hidden) {
  in.file.dtype = type_name(hidden.type);
  in.hidden = std::bind_front(&RawTensor::read_rows, std::move(hidden));
}

std::vector<std::int64_t> read_integers(const RawFile& file, std::uint64_t offset,
                                        std::size_t count, int size, bool is_signed) {
  std::vector<unsigned char> raw(count * static_cast<std::size_t>(size));
  if (!raw.empty()) file.read(offset, raw.data(), raw.size());
  std::vector<std::int64_t> values(count);
  const int bits = 8 * size;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t u = 0;
    for (int j = size - 1; j >= 0; --j) u = u << 8 | raw[i * static_cast<std::size_t>(size) + j];
    const bool negative = is_signed && bits < 64 && (u >> (bits - 1)) != 0;
    values[i] = negative ? static_cast<std::int64_t>(u) - (std::int64_t{1} << bits)
                         : static_cast<std::int64_t>(u);
  }
  return values;
}

}  // namespace cpd::input_files
