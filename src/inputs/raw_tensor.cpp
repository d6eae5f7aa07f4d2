#include "inputs/raw_tensor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "core/errors.h"

namespace cpd::input_files {

float widen(StoredType type, const unsigned char* p) {
  std::uint32_t bits = 0;
  switch (type) {
    case StoredType::f32:
      std::memcpy(&bits, p, 4);
      break;
    case StoredType::bf16:
      bits = (std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8) << 16;
      break;
    case StoredType::f16: {
      const std::uint32_t h = std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8;
      const std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
      if (exp == 0x1f) {
        bits = sign | 0x7f800000u | man << 13;  // inf, NaN
      } else if (exp != 0) {
        bits = sign | (exp + 112) << 23 | man << 13;  // normal: rebias 15 → 127
      } else if (man == 0) {
        bits = sign;  // ±0
      } else {
        // Subnormal: man · 2^-24, normalised (exact in FP32).
        int shift = 0;
        std::uint32_t m = man;
        while ((m & 0x400u) == 0) {
          m <<= 1;
          ++shift;
        }
        bits = sign | static_cast<std::uint32_t>(113 - shift) << 23 | (m & 0x3ffu) << 13;
      }
      break;
    }
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
  const std::int64_t heads = shape[1], seq = shape[2], dim = shape[3];
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
  const auto reader = [](const RawTensor& t) {
    return [t](int b, std::int64_t h, Range r, float* out) { t.read_rows(b, h, r, out); };
  };
  in.q = reader(tensors[0]);
  in.k = reader(tensors[1]);
  in.v = reader(tensors[2]);
}

std::vector<std::int64_t> decode_integers(const unsigned char* raw, std::size_t count, int size,
                                          bool is_signed) {
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
