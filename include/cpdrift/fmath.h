// Elementary functions shared bit for bit by the CPU and CUDA backends.
//
// Every result is a fixed sequence of IEEE operations with one rounding each (+, -, *, explicit
// fma, float<->double conversion) plus integer bit manipulation, so any conforming compiler that
// does not contract or reassociate (g++ -ffp-contract=off, nvcc --fmad=false, no fast-math, no
// FTZ/DAZ) produces the same bits. NaN results are always the canonical nan_f32(), never a
// propagated payload: x86 and CUDA disagree on which NaN bits arithmetic produces.
//
// Max error in float ulps of the exact result, over all 2^32 inputs (bounds asserted by
// tests/test_fmath.cpp): exp_f32 0.66 (0.77 for subnormal results, which round twice), log_f32
// 0.62, log1p_f32 0.63, sincos_f32 and sincos_2pi_f32 0.5 + 2^-20 (an FP64 result accurate to
// ~2^-50 relative, rounded once: correctly rounded except within ~2^-26 ulp of a tie). exp_f64,
// the one FP64 function, by analysis in double ulps: 0.86 (0.93 below 2^-1021), checked against
// long double by tests/test_exp_f64.cpp.
#pragma once

#include <cstdint>

#include "cpdrift/hd.h"

namespace cpd {
namespace fmath_detail {

/// 2^k as a float for k in [-126, 127]; garbage (but no UB) outside.
CPD_HD float pow2i_f32(std::int32_t k) {
  return float_of_bits(static_cast<std::uint32_t>(k + 127) << 23);
}

/// Round to nearest even integer for any double: |w| >= 2^52 is already integral, below that
/// adding and subtracting 2^52 (same sign as w) leaves only the integer bits.
CPD_HD double rint_f64(double w) {
  const double big = w < 0.0 ? -0x1p52 : 0x1p52;
  const double r = (w + big) - big;
  return (w < 0.0 ? -w : w) < 0x1p52 ? r : w;
}

/// v - 4*round(v/4), exact (Sterbenz), in [-2, 2]. v/4 is exact, so no double rounding.
CPD_HD double mod4_f64(double v) { return v - 4.0 * rint_f64(v * 0.25); }

// log(2^e (1 + f + extra)) for f in [sqrt(1/2)-1, sqrt(2)-1] and |extra| <= 2^-26.
// log(1+f) = f - f^2/2 + f^3 P(f): P is a float minimax fit (coefficients rounded one at a time
// and the rest refitted), relative error of the log result < 2^-30. e ln2 + f - f^2/2 is carried
// exactly as v + (small terms), so the only large rounding is the final addition.
CPD_HD float log_core(float e, float f, float extra) {
  // ln2 = kLn2Hi + kLn2Lo with kLn2Hi on 15 bits: e * kLn2Hi is exact for |e| < 256.
  constexpr float kLn2Hi = 0x1.62e4p-1f, kLn2Lo = 0x1.7f7d1cp-20f;
  const float hi = e * kLn2Hi;
  // Fast2Sum twice (the larger operand comes first: |hi| >= 0.69 > |f| unless hi == 0, and
  // |hi + f| >= 0.28 or = |f|, both > f^2/2): s + err == hi + f and v + ve == s - f^2/2.
  const float s = hi + f;
  const float err = (hi - s) + f;
  const float f2 = f * f;
  const float f2l = fma_f32(f, f, -f2);  // f^2 == f2 + f2l exactly
  const float hh = 0.5f * f2;
  const float v = s - hh;
  const float ve = (s - v) - hh;
  float p = 0x1.1ca444p-4f;
  p = fma_f32(p, f, -0x1.e4a0f2p-4f);
  p = fma_f32(p, f, 0x1.e6738cp-4f);
  p = fma_f32(p, f, -0x1.fadc6ap-4f);
  p = fma_f32(p, f, 0x1.2327bcp-3f);
  p = fma_f32(p, f, -0x1.55664cp-3f);
  p = fma_f32(p, f, 0x1.99a626p-3f);
  p = fma_f32(p, f, -0x1.ffffep-3f);
  p = fma_f32(p, f, 0x1.555544p-2f);
  const float small = fma_f32(-0.5f, f2l, (ve + err) + fma_f32(e, kLn2Lo, extra));
  return v + fma_f32(f2 * f, p, small);
}

/// sin and cos of r (|r| <= pi/4 + tiny) rotated by q quarter turns, rounded once to float.
/// fdlibm's __kernel_sin/__kernel_cos minimax coefficients: polynomial error < 2^-58.
CPD_HD void sincos_reduced(double r, std::uint32_t q, float& s, float& c) {
  const double z = r * r;
  double ps = 1.58969099521155010221e-10;
  ps = fma_f64(ps, z, -2.50507602534068634195e-08);
  ps = fma_f64(ps, z, 2.75573137070700676789e-06);
  ps = fma_f64(ps, z, -1.98412698298579493134e-04);
  ps = fma_f64(ps, z, 8.33333333332248946124e-03);
  ps = fma_f64(ps, z, -1.66666666666666324348e-01);
  double pc = -1.13596475577881948265e-11;
  pc = fma_f64(pc, z, 2.08757232129817482790e-09);
  pc = fma_f64(pc, z, -2.75573143513906633035e-07);
  pc = fma_f64(pc, z, 2.48015872894767294178e-05);
  pc = fma_f64(pc, z, -1.38888888888741095749e-03);
  pc = fma_f64(pc, z, 4.16666666666666019037e-02);
  const double sn = fma_f64(r * z, ps, r);
  const double cs = fma_f64(z * z, pc, fma_f64(-0.5, z, 1.0));
  double sv = (q & 1u) ? cs : sn;
  double cv = (q & 1u) ? sn : cs;
  sv = (q & 2u) ? -sv : sv;
  cv = ((q + 1u) & 2u) ? -cv : cv;
  s = static_cast<float>(sv);
  c = static_cast<float>(cv);
}

// pi/2 = kPio2_1 + kPio2_2 + kPio2_3 (+ < 2^-160).
constexpr double kPio2_1 = 0x1.921fb54442d18p+0;
constexpr double kPio2_2 = 0x1.1a62633145c07p-54;
constexpr double kPio2_3 = -0x1.f1976b7ed8fbcp-110;

/// Adds x * part (mod 4), exactly as hi + lo up to one rounding of lo: the two-product ph + pl is
/// exact (24 x 53 bits), each piece is reduced mod 4 exactly (pieces >= 2^54 are multiples of 4),
/// and each is added with TwoSum.
CPD_HD void add_mod4_product(double x, double part, double& hi, double& lo) {
  const double ph = x * part;
  const double pl = fma_f64(x, part, -ph);
  const double v0 = mod4_f64(ph), v1 = mod4_f64(pl);
  double s = hi + v0, b = s - hi;
  lo += (hi - (s - b)) + (v0 - b);
  hi = s;
  s = hi + v1;
  b = s - hi;
  lo += (hi - (s - b)) + (v1 - b);
  hi = s;
}

/// Payne-Hanek reduction without a table, for |x| >= 2^30 (exact x of float origin): x * 2/pi
/// mod 4 from five positive, truncated 53-bit parts of 2/pi. The bits of 2/pi after the fifth
/// part weigh < 2^128 * 2^-268 quarter turns. Returns r in radians and the quadrant q.
CPD_HD double reduce_large(double x, std::uint32_t& q) {
  double hi = 0.0, lo = 0.0;
  add_mod4_product(x, 0x1.45f306dc9c882p-1, hi, lo);
  add_mod4_product(x, 0x1.4a7f09d5f47d4p-54, hi, lo);
  add_mod4_product(x, 0x1.a6ee06db14accp-107, hi, lo);
  add_mod4_product(x, 0x1.3c439041fe516p-160, hi, lo);
  add_mod4_product(x, 0x1.d5ef5de2b0db9p-215, hi, lo);
  const double k = rint_f64(hi);
  q = static_cast<std::uint32_t>(static_cast<std::int32_t>(mod4_f64(k))) & 3u;
  const double f = (hi - k) + lo;  // hi - k is exact; |f| <= 1/2 + tiny quarter turns
  return fma_f64(f, kPio2_1, f * kPio2_2);
}

/// x clamped to [lo, hi] by compares and selects; NaN passes through.
template <class L, class F>
CPD_HD F clamp_by_selects(F x, float lo, float hi) {
  return L::select(L::gt(x, L::splat(hi)), L::splat(hi),
                   L::select(L::lt(x, L::splat(lo)), L::splat(lo), x));
}

/// p·2^n for p in [1/2, 2] and n in [-150, 128], rounded once: (p·2^h)·2^(n-h) with h = n >> 1,
/// both powers normal floats built as bits (k+127) << 23 and the first product exact, so a
/// subnormal result rounds once.
template <class L, class F, class I>
CPD_HD F scale_by_products(F p, I n) {
  const I h = L::sra1(n);
  const I bias = L::isplat(127);
  return L::mul(L::mul(p, L::from_bits(L::shl23(L::iadd(h, bias)))),
                L::from_bits(L::shl23(L::iadd(L::isub(n, h), bias))));
}

}  // namespace fmath_detail

/// The lane operations exp's sequence is written in. This specialisation is one FP32 value;
/// the CPU kernel specialises it for 16 SIMD lanes (src/kernels/cpu/simd16_math.h), so both run the
/// very same sequence below. clamp and scale may take other instructions where they give the
/// same bits as clamp_by_selects and scale_by_products for every input.
template <class F>
struct Lanes;

template <>
struct Lanes<float> {
  using I = std::int32_t;
  using M = bool;
  static CPD_HD float splat(float x) { return x; }
  static CPD_HD I isplat(std::int32_t x) { return x; }
  static CPD_HD float fma(float a, float b, float c) { return fma_f32(a, b, c); }
  static CPD_HD float add(float a, float b) { return a + b; }
  static CPD_HD float sub(float a, float b) { return a - b; }
  static CPD_HD float mul(float a, float b) { return a * b; }
  static CPD_HD M gt(float a, float b) { return a > b; }
  static CPD_HD M lt(float a, float b) { return a < b; }
  static CPD_HD M is_nan(float a) { return is_nan_f32(a); }
  static CPD_HD float select(M m, float a, float b) { return m ? a : b; }
  static CPD_HD I bits(float a) { return static_cast<I>(bits_of(a)); }
  static CPD_HD float from_bits(I a) { return float_of_bits(static_cast<std::uint32_t>(a)); }
  static CPD_HD I iadd(I a, I b) {
    return static_cast<I>(static_cast<std::uint32_t>(a) + static_cast<std::uint32_t>(b));
  }
  static CPD_HD I isub(I a, I b) {
    return static_cast<I>(static_cast<std::uint32_t>(a) - static_cast<std::uint32_t>(b));
  }
  static CPD_HD I sra1(I a) { return a >> 1; }
  static CPD_HD I shl23(I a) { return static_cast<I>(static_cast<std::uint32_t>(a) << 23); }
  static CPD_HD float clamp(float x, float lo, float hi) {
    return fmath_detail::clamp_by_selects<Lanes>(x, lo, hi);
  }
  /// p·2^n, kf == n as a float (see scale_by_products).
  static CPD_HD float scale(float p, float, I n) {
    return fmath_detail::scale_by_products<Lanes>(p, n);
  }
};

/// e^x on any lane type. Overflows to +inf for x > 88.72283 (first float 0x42b17218), returns
/// +0 below -103.97208.
template <class F, class L = Lanes<F>>
CPD_HD F exp_lanes(F x) {
  // Operation sequence:
  //   xc   = x > 89 ? 89 : (x < -104 ? -104 : x)     clamp; NaN passes through
  //   t    = fma(xc, LOG2E, 0x1.8p23)                n = round(x/ln2) in t's low mantissa bits
  //   kf   = t - 0x1.8p23                            exact
  //   n    = int32(bits(t) - bits(0x1.8p23))         integer n in [-150, 128]
  //   r1   = fma(kf, -LN2_HI, xc)                    exact: multiple of 2^-25 below 1/2
  //   lo   = kf * NLN2_LO                            NLN2_LO = -(ln2 - LN2_HI)
  //   r    = fma(kf, NLN2_LO, r1)                    x - n ln2, argument of the polynomial
  //   s    = 1 + r1
  //   e1   = (1 - s) + r1                            Fast2Sum: s + e1 == 1 + r1 exactly
  //   q    = fma(fma(fma(fma(fma(C5,r,C4),r,C3),r,C2),r,C1),r,0.5)   q ~ (e^r - 1 - r)/r^2
  //   tail = fma(r * r, q, e1 + lo)
  //   p    = s + tail                                e^r, the only rounding that matters
  //   h    = n >> 1   (arithmetic shift)
  //   y    = (p * 2^h) * 2^(n-h)                     2^k built as bits (k+127) << 23; the first
  //                                                  product is exact, so subnormals round once
  //                                                  (scale_by_products; L::scale)
  //   y    = isnan(x) ? canonical NaN : y
  // Overflow (y = inf, incl. x = +inf) and underflow to +0 (incl. x = -inf) come out of the final
  // product; exp(0) = 1 and exp(-inf) = +0 exactly.
  constexpr float kLog2e = 0x1.715476p+0f, kMagic = 0x1.8p23f;
  constexpr float kLn2Hi = 0x1.62e43p-1f, kNegLn2Lo = 0x1.05c61p-29f;
  const F xc = L::clamp(x, -104.0f, 89.0f);
  const F t = L::fma(xc, L::splat(kLog2e), L::splat(kMagic));
  const F kf = L::sub(t, L::splat(kMagic));
  const auto n = L::isub(L::bits(t), L::bits(L::splat(kMagic)));
  const F r1 = L::fma(kf, L::splat(-kLn2Hi), xc);
  const F lo = L::mul(kf, L::splat(kNegLn2Lo));
  const F r = L::fma(kf, L::splat(kNegLn2Lo), r1);
  const F s = L::add(L::splat(1.0f), r1);
  const F e1 = L::add(L::sub(L::splat(1.0f), s), r1);
  F q = L::splat(0x1.6b9e1ap-13f);
  q = L::fma(q, r, L::splat(0x1.6d4106p-10f));
  q = L::fma(q, r, L::splat(0x1.11371cp-7f));
  q = L::fma(q, r, L::splat(0x1.5554f2p-5f));
  q = L::fma(q, r, L::splat(0x1.55553cp-3f));
  q = L::fma(q, r, L::splat(0.5f));
  const F tail = L::fma(L::mul(r, r), q, L::add(e1, lo));
  const F p = L::add(s, tail);
  const F y = L::scale(p, kf, n);
  return L::select(L::is_nan(x), L::splat(nan_f32()), y);
}

/// e^x in FP32 (see exp_lanes).
CPD_HD float exp_f32(float x) { return exp_lanes(x); }

/// e^x in FP64: exp_lanes' scheme with FP64 constants, a degree-11 polynomial and the
/// scaling built from unsigned shifts, all without branches, so that a loop of it vectorises.
/// Overflows to +inf for x > 709.782712893384 (ln DBL_MAX), gives +0 below about -745.13;
/// exp(0) = 1 and exp(-inf) = +0 exactly, NaN is the canonical nan_f64().
///
///   xc = clamp(x, -746, 709.8)      NaN passes through
///   t  = fma(xc, LOG2E, 0x1.8p52)   n = round(x/ln2) in t's low mantissa bits; kf = t - 0x1.8p52
///   r1 = fma(kf, -LN2_HI, xc)       exact: LN2_HI has 32 significant bits and |r1| < 1/2
///   r  = fma(kf, NLN2_LO, r1)       x - n ln2, the polynomial's argument, |r| < 0.3466
///   s  = 1 + r1, e1 = (1 - s) + r1  Fast2Sum: s + e1 == 1 + r1 exactly
///   q  = Σ_{k=2..13} r^(k-2)/k!     (e^r - 1 - r)/r^2; the first term left out is < 2^-57 e^r
///   p  = s + fma(r*r, q, e1 + kf*NLN2_LO)      e^r, the only rounding that matters
///   y  = (p * 2^h) * 2^(n-h)        h = floor(n/2): the first product is exact, so a subnormal
///                                   result rounds once more
/// Error against the exact e^x: at most 0.86 ulp for normal results, 0.93 ulp below 2^-1021,
/// where p is rounded twice (tests/test_exp_f64.cpp gives the analysis and checks it against
/// long double expl: 0.69 and 0.77 the largest seen).
CPD_HD double exp_f64(double x) {
  constexpr double kLog2e = 0x1.71547652b82fep+0, kMagic = 0x1.8p52;
  constexpr double kLn2Hi = 0x1.62e42feep-1, kNegLn2Lo = -0x1.a39ef35793c76p-33;
  double xc = x > 709.8 ? 709.8 : x;
  xc = xc < -746.0 ? -746.0 : xc;
  const double t = fma_f64(xc, kLog2e, kMagic);
  const double kf = t - kMagic;
  // n + 2048 in [972, 3072]: non-negative, so h = floor(n/2) comes from a logical shift.
  const std::uint64_t n2048 = bits_of(t) - bits_of(kMagic) + 2048u;
  const std::uint64_t h2048 = n2048 >> 1;  // h + 1024
  const double r1 = fma_f64(kf, -kLn2Hi, xc);
  const double lo = kf * kNegLn2Lo;
  const double r = fma_f64(kf, kNegLn2Lo, r1);
  const double s = 1.0 + r1;
  const double e1 = (1.0 - s) + r1;
  double q = 0x1.6124613a86d09p-33;          // 1/13!
  q = fma_f64(q, r, 0x1.1eed8eff8d898p-29);  // 1/12!
  q = fma_f64(q, r, 0x1.ae64567f544e4p-26);  // 1/11!
  q = fma_f64(q, r, 0x1.27e4fb7789f5cp-22);  // 1/10!
  q = fma_f64(q, r, 0x1.71de3a556c734p-19);  // 1/9!
  q = fma_f64(q, r, 0x1.a01a01a01a01ap-16);  // 1/8!
  q = fma_f64(q, r, 0x1.a01a01a01a01ap-13);  // 1/7!
  q = fma_f64(q, r, 0x1.6c16c16c16c17p-10);  // 1/6!
  q = fma_f64(q, r, 0x1.1111111111111p-7);   // 1/5!
  q = fma_f64(q, r, 0x1.5555555555555p-5);   // 1/4!
  q = fma_f64(q, r, 0x1.5555555555555p-3);   // 1/3!
  q = fma_f64(q, r, 0.5);
  const double p = s + fma_f64(r * r, q, e1 + lo);
  // 2^h and 2^(n-h) as bits (k + 1023) << 52, k in [-538, 512]: both normal.
  const double scale_h = double_of_bits((h2048 - 1024u + 1023u) << 52);
  const double scale_rest = double_of_bits((n2048 - h2048 - 1024u + 1023u) << 52);
  const double y = (p * scale_h) * scale_rest;
  return is_nan_f64(x) ? nan_f64() : y;
}

/// Natural logarithm. Subnormal inputs are scaled by 2^23 first; log(1) = +0.
CPD_HD float log_f32(float x) {
  const bool sub = x < 0x1p-126f;
  const float xs = sub ? x * 0x1p23f : x;
  // x = 2^k m with m in [sqrt(1/2), sqrt(2)): bias the bits so the exponent field rounds at
  // sqrt(2) instead of 2 (0x3f3504f3 = sqrt(1/2)).
  const std::uint32_t ix = bits_of(xs) + (0x3f800000u - 0x3f3504f3u);
  const std::int32_t k = static_cast<std::int32_t>(ix >> 23) - (sub ? 150 : 127);
  const float f = float_of_bits((ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f;  // exact (Sterbenz)
  float y = fmath_detail::log_core(static_cast<float>(k), f, 0.0f);
  y = x == inf_f32() ? x : y;
  y = x == 0.0f ? neg_inf_f32() : y;
  return (x < 0.0f || is_nan_f32(x)) ? nan_f32() : y;
}

/// log(1 + x), using the same core as log_f32 on an exact reduction of 1 + x.
CPD_HD float log1p_f32(float x) {
  // Above 2^24, log(1+x) - log(x) < 2^-24 is far below half an ulp of the result (>= 16.6).
  if (!(x < 0x1p24f)) return log_f32(x);  // also +inf and NaN
  // The exponent k comes from the rounded u = 1 + x; with sc = 2^-k, (1 + x) sc - 1 = x sc +
  // (sc - 1), both terms exact (|k| <= 24). Their sum f is rounded (it needs 25 bits when k = 1
  // and x < 1/2); TwoSum keeps the error rho, and log1p(f + rho) =
  // log1p(f) + rho/(1+f), with 1/(1+f) ~ 1 - f + f^2 (5% off at worst, on a term < 2^-26).
  const float u = 1.0f + x;
  const std::uint32_t iu = bits_of(u) + (0x3f800000u - 0x3f3504f3u);
  const std::int32_t k = static_cast<std::int32_t>(iu >> 23) - 127;
  const float sc = fmath_detail::pow2i_f32(-k);
  const float xs = x * sc, c = sc - 1.0f;
  const float f = xs + c;
  const float b = f - xs;
  const float rho = (xs - (f - b)) + (c - b);
  float y = fmath_detail::log_core(static_cast<float>(k), f, rho * fma_f32(f, f - 1.0f, 1.0f));
  y = x == 0.0f ? x : y;  // keeps the sign of zero
  y = x == -1.0f ? neg_inf_f32() : y;
  return x < -1.0f ? nan_f32() : y;
}

/// sin(x) and cos(x). FP64 inside: Cody-Waite with a three-part pi/2 for |x| < 2^30, table-free
/// Payne-Hanek above; either way the reduced argument is accurate to ~2^-52 relative, so the
/// float results are correctly rounded unless the exact value lies within ~2^-50 (relative) of
/// a rounding boundary.
CPD_HD void sincos_f32(float x, float& s, float& c) {
  using namespace fmath_detail;
  const double xd = is_finite_f32(x) ? static_cast<double>(x) : 0.0;
  double r;
  std::uint32_t q;
  if ((xd < 0.0 ? -xd : xd) < 0x1p30) {
    // |k| < 2^30: k*kPio2_1 and x share the grid 2^-52 (or k = 0), and |x - k kPio2_1| < 2, so
    // the first fma is exact; the next two add the tail with one rounding each.
    const double t = fma_f64(xd, 0x1.45f306dc9c883p-1, 0x1.8p52);  // 2/pi
    const double k = t - 0x1.8p52;
    q = static_cast<std::uint32_t>(bits_of(t)) & 3u;
    r = fma_f64(-k, kPio2_1, xd);
    r = fma_f64(-k, kPio2_2, r);
    r = fma_f64(-k, kPio2_3, r);
  } else {
    r = reduce_large(xd, q);
  }
  sincos_reduced(r, q, s, c);
  s = x == 0.0f ? x : s;  // sin(-0) = -0
  if (!is_finite_f32(x)) s = c = nan_f32();
}

/// sin(2 pi u) and cos(2 pi u), reduced exactly in turns: 4u = k + f with f in [-1/2, 1/2].
CPD_HD void sincos_2pi_f32(float u, float& s, float& c) {
  using namespace fmath_detail;
  const double w = is_finite_f32(u) ? 4.0 * static_cast<double>(u) : 0.0;  // exact
  const double k = rint_f64(w);
  const double f = w - k;  // exact
  const auto q = static_cast<std::uint32_t>(static_cast<std::int32_t>(mod4_f64(k))) & 3u;
  sincos_reduced(fma_f64(f, kPio2_1, f * kPio2_2), q, s, c);
  if (!is_finite_f32(u)) s = c = nan_f32();
}

}  // namespace cpd
