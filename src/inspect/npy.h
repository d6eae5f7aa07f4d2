// NumPy's .npy format, version 1.0 (numpy.lib.format): what `cpdrift-inspect export` writes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace cpd::inspect {

/// The bytes of a .npy file holding `values` ('<f4': little-endian FP32) in C order with
/// `shape`: the magic "\x93NUMPY", version 1.0, a little-endian uint16 header length, the header
/// dict padded with spaces to a multiple of 64 bytes and ended by '\n', then the data.
/// numpy.load reads it back as an array of that shape and dtype float32.
std::string npy_bytes(std::span<const float> values, const std::vector<std::int64_t>& shape);

}  // namespace cpd::inspect
