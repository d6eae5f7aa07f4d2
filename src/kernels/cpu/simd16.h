// Sixteen FP32 lanes, the CPU kernel's unit of work.
//
// Three implementations with identical per-lane semantics: AVX-512, AVX2+FMA (two halves) and
// portable scalar. Every operation is a single IEEE rounding per lane (fma included), so the
// kernel's bits never depend on which one the build selected.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpdrift/hd.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define CPD_SIMD16_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CPD_SIMD16_AVX2 1
#endif

namespace cpd::simd {

#if defined(CPD_SIMD16_AVX512)

// The unmasked forms of several AVX-512 intrinsics pass an "undefined" register through,
// which GCC 12 reports as maybe-uninitialized at every call site (GCC PR 105593). The masked
// forms with every lane selected are the same instruction and name a real source instead.
constexpr __mmask16 kAll = 0xffff;

inline const char* isa() { return "avx512"; }
inline constexpr int kRegisters = 32;  // vector registers, each one F16
struct F16 {
  __m512 v;
};
struct I16 {
  __m512i v;
};
struct M16 {
  __mmask16 m;
};
inline F16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store(float* p, F16 a) { _mm512_storeu_ps(p, a.v); }
inline F16 splat(float x) { return {_mm512_set1_ps(x)}; }
// `a` held in a register (no instruction): a row loaded once for several FMAs stays one load,
// where GCC would fold a reload into each FMA and double the loads of P·V's loop.
inline F16 in_register(F16 a) {
  asm("" : "+v"(a.v));
  return a;
}
inline F16 fma(F16 a, F16 b, F16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline F16 add(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F16 sub(F16 a, F16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline F16 mul(F16 a, F16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F16 div(F16 a, F16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline F16 max(F16 a, F16 b) { return {_mm512_mask_max_ps(a.v, kAll, a.v, b.v)}; }
// x in [lo, hi] as min(hi, max(lo, x)): vmaxps and vminps return their second operand where
// either is NaN, so a NaN x passes through, as fmath's clamp_by_selects lets it.
inline F16 clamp(F16 x, float lo, float hi) {
  const __m512 low = _mm512_mask_max_ps(x.v, kAll, _mm512_set1_ps(lo), x.v);
  return {_mm512_mask_min_ps(low, kAll, _mm512_set1_ps(hi), low)};
}
// a·2^floor(b), rounded once (vscalefps).
inline F16 scalef(F16 a, F16 b) { return {_mm512_mask_scalef_ps(a.v, kAll, a.v, b.v)}; }
inline M16 lt(F16 a, F16 b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ)}; }
inline M16 gt(F16 a, F16 b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ)}; }
inline M16 unordered(F16 a) { return {_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q)}; }
inline F16 select(M16 m, F16 a, F16 b) { return {_mm512_mask_blend_ps(m.m, b.v, a.v)}; }
inline I16 bits(F16 a) { return {_mm512_castps_si512(a.v)}; }
inline F16 from_bits(I16 a) { return {_mm512_castsi512_ps(a.v)}; }
inline I16 isplat(std::int32_t x) { return {_mm512_set1_epi32(x)}; }
inline I16 iadd(I16 a, I16 b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline I16 isub(I16 a, I16 b) { return {_mm512_sub_epi32(a.v, b.v)}; }
inline I16 iand(I16 a, I16 b) { return {_mm512_and_si512(a.v, b.v)}; }
inline I16 ior(I16 a, I16 b) { return {_mm512_or_si512(a.v, b.v)}; }
template <int kShift>
inline I16 shl(I16 a) {
  return {_mm512_mask_slli_epi32(a.v, kAll, a.v, kShift)};
}
template <int kShift>
inline I16 sra(I16 a) {
  return {_mm512_mask_srai_epi32(a.v, kAll, a.v, kShift)};
}
template <int kShift>
inline I16 srl(I16 a) {
  return {_mm512_mask_srli_epi32(a.v, kAll, a.v, kShift)};
}
// out[c][r] = rows[r·stride + c] for 16 columns c and rows r < nrows (rows past nrows are
// zeros): four stages of 16 shuffles, each output column stored whole.
inline void transpose16(const float* rows, int nrows, std::ptrdiff_t stride, float* out) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i)
    r[i] = i < nrows ? _mm512_loadu_ps(rows + i * stride) : _mm512_setzero_ps();
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane k: elements 4k, 4k+1 of rows i, i+1
    t[i] = _mm512_mask_unpacklo_ps(r[i], kAll, r[i], r[i + 1]);
    t[i + 1] = _mm512_mask_unpackhi_ps(r[i], kAll, r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + m], lane k: column 4k + m of rows i … i+3
    const auto low = [](__m512 a, __m512 b) {
      const __m512d x = _mm512_castps_pd(a);
      return _mm512_castpd_ps(_mm512_mask_unpacklo_pd(x, 0xff, x, _mm512_castps_pd(b)));
    };
    const auto high = [](__m512 a, __m512 b) {
      const __m512d x = _mm512_castps_pd(a);
      return _mm512_castpd_ps(_mm512_mask_unpackhi_pd(x, 0xff, x, _mm512_castps_pd(b)));
    };
    r[i] = low(t[i], t[i + 2]);
    r[i + 1] = high(t[i], t[i + 2]);
    r[i + 2] = low(t[i + 1], t[i + 3]);
    r[i + 3] = high(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8) {  // t[h + m], m < 8: columns m and m + 8 of rows h … h+7
    for (int m = 0; m < 4; ++m) {
      t[h + m] = _mm512_mask_shuffle_f32x4(r[h + m], kAll, r[h + m], r[h + 4 + m], 0x88);
      t[h + 4 + m] = _mm512_mask_shuffle_f32x4(r[h + m], kAll, r[h + m], r[h + 4 + m], 0xdd);
    }
  }
  for (int m = 0; m < 8; ++m) {  // columns m and m + 8 of all 16 rows
    _mm512_storeu_ps(out + m * 16, _mm512_mask_shuffle_f32x4(t[m], kAll, t[m], t[m + 8], 0x88));
    _mm512_storeu_ps(out + (m + 8) * 16,
                     _mm512_mask_shuffle_f32x4(t[m], kAll, t[m], t[m + 8], 0xdd));
  }
}

#elif defined(CPD_SIMD16_AVX2)

inline const char* isa() { return "avx2"; }
inline constexpr int kRegisters = 8;  // F16 values the 16 ymm registers hold
struct F16 {
  __m256 lo, hi;
};
struct I16 {
  __m256i lo, hi;
};
struct M16 {
  __m256 lo, hi;  // all-ones lanes where true
};
inline F16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store(float* p, F16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline F16 splat(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F16 in_register(F16 a) {
  asm("" : "+x"(a.lo), "+x"(a.hi));
  return a;
}
inline F16 fma(F16 a, F16 b, F16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline F16 add(F16 a, F16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline F16 sub(F16 a, F16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline F16 mul(F16 a, F16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F16 div(F16 a, F16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline F16 max(F16 a, F16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline M16 lt(F16 a, F16 b) {
  return {_mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ)};
}
inline M16 gt(F16 a, F16 b) {
  return {_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ)};
}
inline M16 unordered(F16 a) {
  return {_mm256_cmp_ps(a.lo, a.lo, _CMP_UNORD_Q), _mm256_cmp_ps(a.hi, a.hi, _CMP_UNORD_Q)};
}
inline F16 select(M16 m, F16 a, F16 b) {
  return {_mm256_blendv_ps(b.lo, a.lo, m.lo), _mm256_blendv_ps(b.hi, a.hi, m.hi)};
}
inline I16 bits(F16 a) { return {_mm256_castps_si256(a.lo), _mm256_castps_si256(a.hi)}; }
inline F16 from_bits(I16 a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
inline I16 isplat(std::int32_t x) { return {_mm256_set1_epi32(x), _mm256_set1_epi32(x)}; }
inline I16 iadd(I16 a, I16 b) {
  return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)};
}
inline I16 isub(I16 a, I16 b) {
  return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)};
}
inline I16 iand(I16 a, I16 b) {
  return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)};
}
inline I16 ior(I16 a, I16 b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
template <int kShift>
inline I16 shl(I16 a) {
  return {_mm256_slli_epi32(a.lo, kShift), _mm256_slli_epi32(a.hi, kShift)};
}
template <int kShift>
inline I16 sra(I16 a) {
  return {_mm256_srai_epi32(a.lo, kShift), _mm256_srai_epi32(a.hi, kShift)};
}
template <int kShift>
inline I16 srl(I16 a) {
  return {_mm256_srli_epi32(a.lo, kShift), _mm256_srli_epi32(a.hi, kShift)};
}

#else

inline const char* isa() { return "scalar"; }
inline constexpr int kRegisters = 8;  // the vectoriser's business; the narrower blocking
struct F16 {
  float v[16];
};
struct I16 {
  std::int32_t v[16];
};
struct M16 {
  bool v[16];
};
// A function whose result's lane i is `expr` (of the arguments' lane i), for every lane.
#define CPD_LANEWISE(R, name, params, expr)       \
  inline R name params {                          \
    R r;                                          \
    for (int i = 0; i < 16; ++i) r.v[i] = (expr); \
    return r;                                     \
  }
CPD_LANEWISE(F16, load, (const float* p), p[i])
inline void store(float* p, F16 a) {
  for (int i = 0; i < 16; ++i) p[i] = a.v[i];
}
CPD_LANEWISE(F16, splat, (float x), x)
inline F16 in_register(F16 a) { return a; }
CPD_LANEWISE(F16, fma, (F16 a, F16 b, F16 c), fma_f32(a.v[i], b.v[i], c.v[i]))
CPD_LANEWISE(F16, add, (F16 a, F16 b), a.v[i] + b.v[i])
CPD_LANEWISE(F16, sub, (F16 a, F16 b), a.v[i] - b.v[i])
CPD_LANEWISE(F16, mul, (F16 a, F16 b), a.v[i] * b.v[i])
CPD_LANEWISE(F16, div, (F16 a, F16 b), a.v[i] / b.v[i])
CPD_LANEWISE(F16, max, (F16 a, F16 b), a.v[i] > b.v[i] ? a.v[i] : b.v[i])
CPD_LANEWISE(M16, lt, (F16 a, F16 b), a.v[i] < b.v[i])
CPD_LANEWISE(M16, gt, (F16 a, F16 b), a.v[i] > b.v[i])
CPD_LANEWISE(M16, unordered, (F16 a), a.v[i] != a.v[i])
CPD_LANEWISE(F16, select, (M16 m, F16 a, F16 b), m.v[i] ? a.v[i] : b.v[i])
CPD_LANEWISE(I16, bits, (F16 a), static_cast<std::int32_t>(bits_of(a.v[i])))
CPD_LANEWISE(F16, from_bits, (I16 a), float_of_bits(static_cast<std::uint32_t>(a.v[i])))
CPD_LANEWISE(I16, isplat, (std::int32_t x), x)
// Integer lanes wrap as the vector instructions do: the arithmetic in uint32_t.
#define CPD_U32(x) static_cast<std::uint32_t>(x)
CPD_LANEWISE(I16, iadd, (I16 a, I16 b),
             static_cast<std::int32_t>(CPD_U32(a.v[i]) + CPD_U32(b.v[i])))
CPD_LANEWISE(I16, isub, (I16 a, I16 b),
             static_cast<std::int32_t>(CPD_U32(a.v[i]) - CPD_U32(b.v[i])))
CPD_LANEWISE(I16, iand, (I16 a, I16 b), a.v[i] & b.v[i])
CPD_LANEWISE(I16, ior, (I16 a, I16 b), a.v[i] | b.v[i])
template <int kShift>
CPD_LANEWISE(I16, shl, (I16 a), static_cast<std::int32_t>(CPD_U32(a.v[i]) << kShift))
template <int kShift>
CPD_LANEWISE(I16, sra, (I16 a), a.v[i] >> kShift)
template <int kShift>
CPD_LANEWISE(I16, srl, (I16 a), static_cast<std::int32_t>(CPD_U32(a.v[i]) >> kShift))
#undef CPD_U32
#undef CPD_LANEWISE

#endif

#if !defined(CPD_SIMD16_AVX512)
// out[c][r] = rows[r·stride + c] for 16 columns c and rows r < nrows (rows past nrows are
// zeros).
inline void transpose16(const float* rows, int nrows, std::ptrdiff_t stride, float* out) {
  for (int i = 0; i < 256; ++i) out[i] = 0.0f;
  for (int r = 0; r < nrows; ++r) {
    for (int c = 0; c < 16; ++c) out[c * 16 + r] = rows[r * stride + c];
  }
}
#endif

}  // namespace cpd::simd
