#include "core/util/npy_format.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <stdexcept>

namespace cpd {
namespace {

[[noreturn]] void bad(const std::string& why) { throw std::runtime_error(why); }

// The value of `key` in the header dict, e.g. "'<f4'", "False", "(3, 4)".
std::string dict_value(std::string_view header, const std::string& key) {
  const std::size_t k = header.find("'" + key + "'");
  if (k == std::string_view::npos) bad(".npy header has no '" + key + "'");
  std::size_t v = header.find(':', k);
  if (v == std::string_view::npos) bad("malformed .npy header");
  ++v;
  while (v < header.size() && header[v] == ' ') ++v;
  if (v >= header.size()) bad("malformed .npy header");
  const char open = header[v];
  std::size_t end = open == '('    ? header.find(')', v)
                    : open == '\'' ? header.find('\'', v + 1)
                                   : header.find_first_of(",}", v) - 1;
  if (end == std::string_view::npos || end + 1 <= v) bad("malformed .npy header");
  return std::string(header.substr(v, end + 1 - v));
}

}  // namespace

std::size_t NpyHeader::data_bytes() const {
  std::size_t n = static_cast<std::size_t>(itemsize);
  for (const std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

std::string NpyHeader::shape_text() const {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

NpyHeader parse_npy_header(std::string_view bytes) {
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0)
    bad("not a .npy file (no \\x93NUMPY magic)");
  const auto byte = [&](std::size_t i) {
    return static_cast<std::size_t>(static_cast<unsigned char>(bytes[i]));
  };
  const std::size_t major = byte(6);
  std::size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = byte(8) | byte(9) << 8;
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad("truncated .npy header");
    header_len = byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
    offset = 12;
  } else {
    bad(".npy format version " + std::to_string(major) + " (reads 1 to 3)");
  }
  if (bytes.size() < offset + header_len) bad("truncated .npy header");
  const std::string_view header = bytes.substr(offset, header_len);
  NpyHeader h;
  h.data_offset = offset + header_len;
  const std::string descr = dict_value(header, "descr");
  if (descr.size() != 5 || descr.front() != '\'' ||
      (descr[1] != '<' && descr[1] != '|' && !(descr[1] == '>' && descr[3] == '1'))) {
    bad("dtype " + descr + ": reads little-endian integers, floats and bools");
  }
  h.kind = descr[2];
  h.itemsize = descr[3] - '0';
  const bool sized = h.itemsize == 1 || h.itemsize == 2 || h.itemsize == 4 || h.itemsize == 8;
  const bool known = (h.kind == 'f' && h.itemsize >= 2 && sized) ||
                     ((h.kind == 'i' || h.kind == 'u') && sized) ||
                     (h.kind == 'b' && h.itemsize == 1);
  if (!known) bad("dtype " + descr + ": reads int, uint, float16/32/64 and bool");
  const std::string shape = dict_value(header, "shape");
  for (std::size_t i = 1; i < shape.size();) {
    const std::size_t j = shape.find_first_of(",)", i);
    const std::string item = shape.substr(i, j - i);
    if (const std::size_t digits = item.find_first_not_of(' '); digits != std::string::npos) {
      std::int64_t d = -1;
      const char* end = item.data() + item.size();
      const auto [stop, ec] = std::from_chars(item.data() + digits, end, d);
      if (ec != std::errc() || d < 0 ||
          std::find_if(stop, end, [](char c) { return c != ' '; }) != end)
        bad("malformed .npy shape " + shape);
      h.shape.push_back(d);
    }
    if (j == std::string::npos) break;
    i = j + 1;
  }
  if (h.shape.size() > 1 && dict_value(header, "fortran_order") != "False")
    bad("a Fortran-order array: save it in C order");
  return h;
}

}  // namespace cpd
