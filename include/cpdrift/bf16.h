// BF16 storage and conversion, identical on host and device.
#pragma once

#include <cstdint>

#include "cpdrift/hd.h"

namespace cpd {

/// BF16 bits from FP32 with round-to-nearest, ties to even. NaN stays NaN (the payload's top
/// bits and the sign are kept and the quiet bit is set, so a signalling NaN cannot truncate to
/// inf); values that round past the largest BF16 become inf. Same result as CUDA's
/// `__float2bfloat16_rn` for every non-NaN input.
CPD_HD std::uint16_t bf16_bits_rn(float x) {
  const std::uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
}

/// bf16_bits_rn of the FP32 bit pattern `u`, without a branch (the NaN case selected, not
/// jumped to), so that loops over many values vectorise. The same bits for every input.
CPD_HD std::uint32_t bf16_bits_rn_select(std::uint32_t u) {
  const std::uint32_t nan = 0u - static_cast<std::uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
  const std::uint32_t quiet = (u >> 16) | 0x0040u;
  const std::uint32_t nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (quiet & nan) | (nearest & ~nan);
}

/// The FP32 value of a BF16 bit pattern (exact).
CPD_HD float bf16_to_f32(std::uint16_t b) {
  return float_of_bits(static_cast<std::uint32_t>(b) << 16);
}

/// Rounds an FP32 value to the nearest BF16 and returns it as FP32 (exact widening). The BF16
/// paths keep their tensors in FP32 storage holding BF16 values, so kernels read one type.
CPD_HD float round_bf16(float x) { return bf16_to_f32(bf16_bits_rn(x)); }

}  // namespace cpd
