#include "inspect/npy.h"

#include <bit>
#include <cstring>

#include "inspect/dump_reader.h"

namespace cpd::inspect {

std::string npy_bytes(std::span<const float> values, const std::vector<std::int64_t>& shape) {
  std::string dims;  // "a, b, c"; "n," for one axis (a Python tuple either way)
  for (const std::int64_t d : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  if (shape.size() == 1) dims += ",";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // The magic, the version and the length take 10 bytes; the data starts 64-byte aligned.
  constexpr std::size_t kPreamble = 10, kAlign = 64;
  const std::size_t total = (kPreamble + header.size() + 1 + kAlign - 1) / kAlign * kAlign;
  header.append(total - kPreamble - header.size() - 1, ' ');
  header += '\n';
  if (header.size() > 0xffff) throw InspectError("export: the .npy header is too long");
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  const std::size_t at = out.size();
  out.resize(at + values.size() * sizeof(float));
  static_assert(std::endian::native == std::endian::little, "'<f4' is this host's float");
  std::memcpy(out.data() + at, values.data(), values.size() * sizeof(float));
  return out;
}

}  // namespace cpd::inspect
