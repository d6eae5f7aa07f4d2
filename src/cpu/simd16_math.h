// Sixteen-lane versions of the shared math: the same operations as the scalar functions in
// numerics/, lane by lane, so the tile kernel's bits equal the canonical ones.
#pragma once

#include "cpdrift/numerics/bf16.h"
#include "cpdrift/numerics/fmath.h"
#include "simd16.h"

namespace cpd::simd {

/// exp_f32 on 16 lanes.
inline F16 exp(F16 x) {
  alignas(64) float lanes[16];
  store(lanes, x);
  for (float& e : lanes) e = exp_f32(e);
  return load(lanes);
}

/// round_bf16 on 16 lanes: round-to-nearest-even on the top 16 bits, NaN kept quiet.
inline F16 round_bf16(F16 x) {
  const I16 u = bits(x);
  const I16 lsb = iand(srl<16>(u), isplat(1));
  const I16 rounded = iand(iadd(iadd(u, isplat(0x7fff)), lsb), isplat(static_cast<std::int32_t>(0xffff0000u)));
  const I16 quiet = iand(ior(u, isplat(0x00400000)), isplat(static_cast<std::int32_t>(0xffff0000u)));
  return select(unordered(x), from_bits(quiet), from_bits(rounded));
}

}  // namespace cpd::simd
