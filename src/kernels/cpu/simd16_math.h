// Sixteen-lane versions of the shared math: the same operations as the scalar functions in
// numerics/, lane by lane, so the tile kernel's bits equal the canonical ones.
#pragma once

#include "cpdrift/bf16.h"
#include "cpdrift/fmath.h"
#include "kernels/cpu/simd16.h"

namespace cpd {

template <>
struct Lanes<simd::F16> {
  using F = simd::F16;
  using I = simd::I16;
  using M = simd::M16;
  static F splat(float x) { return simd::splat(x); }
  static I isplat(std::int32_t x) { return simd::isplat(x); }
  static F fma(F a, F b, F c) { return simd::fma(a, b, c); }
  static F add(F a, F b) { return simd::add(a, b); }
  static F sub(F a, F b) { return simd::sub(a, b); }
  static F mul(F a, F b) { return simd::mul(a, b); }
  static M gt(F a, F b) { return simd::gt(a, b); }
  static M lt(F a, F b) { return simd::lt(a, b); }
  static M is_nan(F a) { return simd::unordered(a); }
  static F select(M m, F a, F b) { return simd::select(m, a, b); }
  static I bits(F a) { return simd::bits(a); }
  static F from_bits(I a) { return simd::from_bits(a); }
  static I iadd(I a, I b) { return simd::iadd(a, b); }
  static I isub(I a, I b) { return simd::isub(a, b); }
  static I sra1(I a) { return simd::sra<1>(a); }
  static I shl23(I a) { return simd::shl<23>(a); }
#if defined(CPD_SIMD16_AVX512)
  // Two instructions for the clamp's four, and one for the scaling's eight: the same bits
  // (tests/test_simd.cpp compares all 2^32 inputs with the generic forms).
  static F clamp(F x, float lo, float hi) { return simd::clamp(x, lo, hi); }
  // p·2^n rounded once, as scale_by_products gives it: vscalefps rounds the exact product once.
  static F scale(F p, F kf, I) { return simd::scalef(p, kf); }
#else
  static F clamp(F x, float lo, float hi) {
    return fmath_detail::clamp_by_selects<Lanes>(x, lo, hi);
  }
  static F scale(F p, F, I n) { return fmath_detail::scale_by_products<Lanes>(p, n); }
#endif
};

}  // namespace cpd

namespace cpd::simd {

/// exp_f32 on 16 lanes: the same exp_lanes sequence, instantiated for F16.
inline F16 exp(F16 x) { return exp_lanes(x); }

/// round_bf16 on 16 lanes: round-to-nearest-even on the top 16 bits, NaN kept quiet.
inline F16 round_bf16(F16 x) {
  const I16 u = bits(x);
  const I16 lsb = iand(srl<16>(u), isplat(1));
  const I16 rounded =
      iand(iadd(iadd(u, isplat(0x7fff)), lsb), isplat(static_cast<std::int32_t>(0xffff0000u)));
  const I16 quiet =
      iand(ior(u, isplat(0x00400000)), isplat(static_cast<std::int32_t>(0xffff0000u)));
  return select(unordered(x), from_bits(quiet), from_bits(rounded));
}

}  // namespace cpd::simd
