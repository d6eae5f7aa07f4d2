// Reading NumPy's .npy header (numpy.lib.format, versions 1.0–3.0): what the stream readers of
// `cpdrift compare` and the `--inputs` reader need to find an array's type, shape and data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cpd {

struct NpyHeader {
  char kind = 0;     // 'i', 'u', 'f' or 'b' (numpy's dtype.kind)
  int itemsize = 0;  // bytes per element: 1, 2, 4 or 8
  std::vector<std::int64_t> shape;
  std::size_t data_offset = 0;  // where the data starts in the file
  std::size_t data_bytes() const;
  std::string shape_text() const;  // "(3, 4)"
};

/// Parses the header at the start of `bytes` (at least the whole header; the data may follow).
/// Refuses big-endian and Fortran-order multi-dimensional arrays and dtypes other than
/// int/uint/float/bool of 1–8 bytes. Throws std::runtime_error saying what is wrong (without
/// the file's name, which the caller adds).
NpyHeader parse_npy_header(std::string_view bytes);

}  // namespace cpd
