// Accuracy and special values of include/cpdrift/fmath.h against FP64 references.
//
// Errors are in units of the float spacing at the FP64 reference value (2^-149 for subnormal
// results). The asserted bounds are the documented ones: each is the exhaustive maximum over
// all 2^32 inputs (for sin/cos the 2^31 non-negative ones, the functions being odd/even by
// construction; for sincos_2pi all 2^23 u = (2k+1)/2^24), rounded up at the second decimal.
// The last test measures those maxima; it is opt-in (it sweeps every input, minutes on one core):
//   build/tests/test_fmath --no-skip -tc='exhaustive*'
// The sampled sweeps are subsets, so they can only come in at or below the maxima. The FP64
// references (glibc exp/log/log1p/sin/cos) are within ~1 double ulp, i.e. 2^-29 float ulp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>

#include "cpdrift/fmath.h"
#include "split_mix.h"

namespace {

using cpd::bits_of;
using cpd::float_of_bits;
using cpd::testing::SplitMix64;

constexpr std::uint32_t kCanonicalNan = 0x7fc00000u;
constexpr float kInf = std::numeric_limits<float>::infinity();

// exp: the final rounding (0.5) plus the float roundings of r, r*r, q and tail (~0.16 at |r| ~
// ln2/2); exhaustive maximum 0.6596 at x = -0x1.78f22cp+2.
constexpr double kExpBound = 0.66;
// exp with a subnormal result: p = e^r is rounded to 24 bits, then the last multiplication by
// 2^(n-h) rounds it to the subnormal grid; up to 0.25 ulp of the first rounding survives on top
// of the 0.5 of the second. Exhaustive maximum 0.7644 at x = -0x1.5edcb4p+6.
constexpr double kExpSubnormalBound = 0.77;
// log: final rounding plus the roundings of f^3, P and the small-term sum (~0.12 ulp when the
// result is near ln(sqrt 2)); exhaustive maximum 0.6183 at x = 0x1.67ed4p+0.
constexpr double kLogBound = 0.62;
// log1p: the log core on an exactly reduced 1 + x, plus the first-order correction for the one
// rounding of the reduced argument; exhaustive maximum 0.6207 at x = 0x1.a73f7ep-2.
constexpr double kLog1pBound = 0.63;
// sin/cos: an FP64 result with relative error ~2^-50 rounded once to float: 0.5 ulp plus
// < 2^-20 ulp (the reference's own 2^-29 included). Exhaustive maximum: 0.5 (no input is
// misrounded relative to float(std::sin(double)) / float(std::cos(double))).
constexpr double kSinCosBound = 0.5 + 0x1p-20;

double ulp_at(double y) {
  int e = 0;
  std::frexp(std::fabs(y), &e);  // |y| = m 2^e, m in [0.5, 1)
  const int ex = e - 1 < -126 ? -126 : (e - 1 > 127 ? 127 : e - 1);
  return std::ldexp(1.0, ex - 23);
}

// Error of `got` in float ulps of `ref`. A result that overflowed to inf counts as 2^128, as an
// IEEE rounding of ref would.
double ulp_err(float got, double ref) {
  if (std::isnan(ref) || std::isnan(got)) return (std::isnan(ref) && std::isnan(got)) ? 0.0 : 1e30;
  if (std::isinf(static_cast<float>(ref)) && got == static_cast<float>(ref)) return 0.0;
  if (std::isinf(ref)) return 1e30;
  const double g = std::isinf(got) ? std::copysign(0x1p128, got) : static_cast<double>(got);
  return std::fabs(g - ref) / ulp_at(ref);
}

struct MaxErr {
  double err = 0.0;
  float arg = 0.0f;
  long count = 0;
  void add(float x, double e) {
    ++count;
    if (e > err || std::isnan(e)) {
      err = e;
      arg = x;
    }
  }
  void merge(const MaxErr& o) {
    count += o.count;
    if (o.err > err) {
      err = o.err;
      arg = o.arg;
    }
  }
};

// Floats in order as integers: -0 and +0 are adjacent, consecutive floats differ by 1.
std::int64_t key_of(float x) {
  const std::uint32_t b = bits_of(x);
  return (b & 0x80000000u) ? -static_cast<std::int64_t>(b & 0x7fffffffu) - 1
                           : static_cast<std::int64_t>(b);
}
float float_of_key(std::int64_t k) {
  return k < 0 ? float_of_bits(static_cast<std::uint32_t>(-(k + 1)) | 0x80000000u)
               : float_of_bits(static_cast<std::uint32_t>(k));
}

// `n` inputs drawn uniformly by bit pattern from [lo, hi].
template <class Fn>
void sweep_bits(float lo, float hi, long n, std::uint64_t seed, Fn&& fn) {
  SplitMix64 rng{seed};
  const std::int64_t a = key_of(lo), span = key_of(hi) - a + 1;
  for (long i = 0; i < n; ++i)
    fn(float_of_key(a + static_cast<std::int64_t>(rng.next() % static_cast<std::uint64_t>(span))));
}

// Every float from `from` on, `n` of them.
template <class Fn>
void sweep_consecutive(float from, long n, Fn&& fn) {
  const std::int64_t a = key_of(from);
  for (long i = 0; i < n; ++i) fn(float_of_key(a + i));
}

// "0.623001234 ulp at -0x1.4e1p+6 (-83.5168)" for MESSAGE output that can be pasted into docs.
std::string describe(const MaxErr& m) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.9f ulp at %a (%.9g)", m.err, static_cast<double>(m.arg),
                static_cast<double>(m.arg));
  return buf;
}

std::uint64_t fnv1a(std::uint64_t h, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) h = (h ^ ((v >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
  return h;
}

// The error measurements, shared by the sampled tests and the opt-in exhaustive one.
struct ExpErr {
  MaxErr normal, subnormal;
  void operator()(float x) {
    const double ref = std::exp(static_cast<double>(x));
    (ref < 0x1p-126 ? subnormal : normal).add(x, ulp_err(cpd::exp_f32(x), ref));
  }
  void check() const {
    MESSAGE("exp_f32 max error, normal results: " << describe(normal) << ", " << normal.count
                                                  << " inputs");
    MESSAGE("exp_f32 max error, subnormal results: " << describe(subnormal) << ", "
                                                     << subnormal.count << " inputs");
    CHECK(normal.err <= kExpBound);
    CHECK(subnormal.err <= kExpSubnormalBound);
  }
};

// One function against its FP64 reference on the domain where the reference is finite.
template <float (*F)(float), double (*Ref)(double)>
struct UnaryErr {
  const char* name;
  MaxErr m;
  void operator()(float x) { m.add(x, ulp_err(F(x), Ref(double{x}))); }
  void check(double bound) const {
    MESSAGE(std::string(name) << " max error: " << describe(m) << ", " << m.count << " inputs");
    CHECK(m.err <= bound);
  }
};
double log_ref(double x) { return std::log(x); }
double log1p_ref(double x) { return std::log1p(x); }
using LogErr = UnaryErr<cpd::log_f32, log_ref>;
using Log1pErr = UnaryErr<cpd::log1p_f32, log1p_ref>;

struct SinCosMaxErr {
  MaxErr ms, mc;
  void check(const char* name) const {
    MESSAGE(std::string(name) << " max error: sin " << describe(ms) << ", cos " << describe(mc)
                              << ", " << ms.count << " inputs");
    CHECK(ms.err <= kSinCosBound);
    CHECK(mc.err <= kSinCosBound);
  }
};

struct SinCosErr : SinCosMaxErr {
  void operator()(float x) {
    float s = 0.0f, c = 0.0f;
    cpd::sincos_f32(x, s, c);
    ms.add(x, ulp_err(s, std::sin(double{x})));
    mc.add(x, ulp_err(c, std::cos(double{x})));
  }
};

// sincos_2pi_f32 at u = (2k+1)/2^24. Reference: 4u = n + f exactly, then sinl/cosl of f·pi/2 in
// long double (64-bit mantissa), so it carries no rounding of 2·pi·u; its error is ~2^-63.
struct SinCos2piErr : SinCosMaxErr {
  void operator()(std::uint32_t k) {
    const float u = static_cast<float>((2.0 * k + 1.0) * 0x1p-24);  // exact
    float s = 0.0f, c = 0.0f;
    cpd::sincos_2pi_f32(u, s, c);
    const long double w = 4.0L * u, n = nearbyintl(w), r = (w - n) * 1.57079632679489661923132169L;
    const long double sr = sinl(r), cr = cosl(r);
    const int q = static_cast<int>(n) & 3;
    const long double rs = q == 0 ? sr : q == 1 ? cr : q == 2 ? -sr : -cr;
    const long double rc = q == 0 ? cr : q == 1 ? -sr : q == 2 ? -cr : sr;
    ms.add(u, ulp_err(s, static_cast<double>(rs)));
    mc.add(u, ulp_err(c, static_cast<double>(rc)));
  }
};

}  // namespace

TEST_CASE("exp_f32 accuracy") {
  ExpErr check;
  sweep_bits(-104.0f, 89.0f, 3'000'000, 1, check);   // whole meaningful domain
  sweep_bits(-0x1p-4f, 0x1p-4f, 500'000, 2, check);  // near 0, down to 2^-149
  sweep_consecutive(float_of_bits(0x42b17218u - 100'000), 200'000, check);  // overflow edge
  sweep_consecutive(float_of_bits(0xc2cff1b5u - 100'000), 200'000, check);  // underflow edge
  sweep_consecutive(-87.4f, 600'000, check);  // normal/subnormal result boundary, downwards
  CHECK(check.normal.count + check.subnormal.count >= 1'000'000);
  check.check();
}

TEST_CASE("exp_f32 special values") {
  CHECK(bits_of(cpd::exp_f32(0.0f)) == bits_of(1.0f));
  CHECK(bits_of(cpd::exp_f32(-0.0f)) == bits_of(1.0f));
  CHECK(bits_of(cpd::exp_f32(-kInf)) == 0u);  // +0, not -0
  CHECK(cpd::exp_f32(kInf) == kInf);
  CHECK(bits_of(cpd::exp_f32(cpd::nan_f32())) == kCanonicalNan);
  CHECK(bits_of(cpd::exp_f32(float_of_bits(0xffc12345u))) == kCanonicalNan);  // payload dropped
  CHECK(cpd::exp_f32(std::numeric_limits<float>::max()) == kInf);
  CHECK(bits_of(cpd::exp_f32(-std::numeric_limits<float>::max())) == 0u);
  for (float x : {0x1p-149f, 0x1.fffffcp-127f, 0x1p-126f, -0x1p-149f, -0x1p-126f})
    CHECK(cpd::exp_f32(x) == 1.0f);  // e^x = 1 + x rounds to 1
  // Overflow: ln(FLT_MAX + half ulp) = 88.7228391; the last float below it gives FLT_MAX - 255
  // ulp (correctly rounded), the next one +inf.
  const float last_finite = float_of_bits(0x42b17217u), first_inf = float_of_bits(0x42b17218u);
  CHECK(std::exp(static_cast<double>(last_finite)) < 0x1p128 * (1 - 0x1p-25));
  CHECK(std::exp(static_cast<double>(first_inf)) > 0x1p128 * (1 - 0x1p-25));
  CHECK(cpd::exp_f32(last_finite) == static_cast<float>(std::exp(double{last_finite})));
  CHECK(cpd::exp_f32(first_inf) == kInf);
  // Underflow: results round to zero below e^x = 2^-150, i.e. x = -150 ln2 = -103.9720771.
  const float last_nonzero = float_of_bits(0xc2cff1b4u), first_zero = float_of_bits(0xc2cff1b5u);
  CHECK(std::exp(static_cast<double>(last_nonzero)) > 0x1p-150);
  CHECK(std::exp(static_cast<double>(first_zero)) < 0x1p-150);
  CHECK(cpd::exp_f32(last_nonzero) == 0x1p-149f);
  CHECK(bits_of(cpd::exp_f32(first_zero)) == 0u);
  CHECK(bits_of(cpd::exp_f32(-104.0f)) == 0u);
}

TEST_CASE("log_f32 accuracy") {
  LogErr check{"log_f32", {}};
  sweep_bits(0x1p-149f, std::numeric_limits<float>::max(), 3'000'000, 3, check);  // all finite
  sweep_bits(0x1p-149f, 0x1.fffffcp-127f, 200'000, 4, check);                     // subnormals
  sweep_consecutive(float_of_bits(bits_of(1.0f) - 200'000), 400'000, check);      // around 1
  sweep_consecutive(float_of_bits(0x3f3504f3u - 50'000), 100'000, check);         // sqrt(1/2)
  sweep_consecutive(float_of_bits(0x3fb504f3u - 50'000), 100'000, check);         // sqrt(2)
  CHECK(check.m.count >= 1'000'000);
  check.check(kLogBound);
}

TEST_CASE("log_f32 special values") {
  CHECK(bits_of(cpd::log_f32(1.0f)) == 0u);  // +0 exactly
  CHECK(cpd::log_f32(0.0f) == -kInf);
  CHECK(cpd::log_f32(-0.0f) == -kInf);
  CHECK(cpd::log_f32(kInf) == kInf);
  CHECK(bits_of(cpd::log_f32(-1.0f)) == kCanonicalNan);
  CHECK(bits_of(cpd::log_f32(-0x1p-149f)) == kCanonicalNan);
  CHECK(bits_of(cpd::log_f32(-kInf)) == kCanonicalNan);
  CHECK(bits_of(cpd::log_f32(cpd::nan_f32())) == kCanonicalNan);
  CHECK(bits_of(cpd::log_f32(float_of_bits(0x7f812345u))) == kCanonicalNan);
  // Edges of the domain; these happen to be correctly rounded, so compare bitwise.
  for (float x :
       {0x1p-149f, 0x1.fffffcp-127f, 0x1p-126f, std::numeric_limits<float>::max(), 2.0f, 0.5f})
    CHECK(cpd::log_f32(x) == static_cast<float>(std::log(double{x})));
}

TEST_CASE("log1p_f32 accuracy") {
  Log1pErr check{"log1p_f32", {}};
  const float above_m1 = float_of_bits(0xbf7fffffu);  // -1 + 2^-24
  sweep_bits(above_m1, -0.0f, 1'500'000, 5, check);
  sweep_bits(0.0f, std::numeric_limits<float>::max(), 1'500'000, 6, check);
  sweep_bits(-0x1p-3f, 0x1p-3f, 300'000, 7, check);                        // near 0
  sweep_consecutive(above_m1, 100'000, check);                             // near -1, upwards
  sweep_consecutive(float_of_bits(0x3ed413cdu - 50'000), 100'000, check);  // sqrt(2) - 1
  sweep_consecutive(float_of_bits(0xbe95f61au - 50'000), 100'000, check);  // sqrt(1/2) - 1
  sweep_consecutive(float_of_bits(0x3f000000u - 50'000), 100'000, check);  // below 1/2: f rounded
  sweep_consecutive(float_of_bits(0x4b800000u - 50'000), 100'000, check);  // 2^24 switch to log
  CHECK(check.m.count >= 1'000'000);
  check.check(kLog1pBound);
}

TEST_CASE("log1p_f32 special values") {
  CHECK(bits_of(cpd::log1p_f32(0.0f)) == bits_of(0.0f));
  CHECK(bits_of(cpd::log1p_f32(-0.0f)) == bits_of(-0.0f));
  CHECK(cpd::log1p_f32(-1.0f) == -kInf);
  CHECK(bits_of(cpd::log1p_f32(-1.5f)) == kCanonicalNan);
  CHECK(bits_of(cpd::log1p_f32(float_of_bits(0xbf800001u))) == kCanonicalNan);  // just below -1
  CHECK(bits_of(cpd::log1p_f32(-kInf)) == kCanonicalNan);
  CHECK(bits_of(cpd::log1p_f32(cpd::nan_f32())) == kCanonicalNan);
  CHECK(bits_of(cpd::log1p_f32(float_of_bits(0xffc00001u))) == kCanonicalNan);
  CHECK(cpd::log1p_f32(kInf) == kInf);
  for (float x : {0x1p-149f, -0x1p-149f, 0x1.fffffcp-127f, 0x1p-126f, 1e-30f, -1e-30f, 0x1p-25f})
    CHECK(cpd::log1p_f32(x) == x);  // |x| < 2^-24: x - x^2/2 rounds to x
  for (float x : {float_of_bits(0xbf7fffffu), std::numeric_limits<float>::max(), 1.0f, 0x1p24f})
    CHECK(cpd::log1p_f32(x) == static_cast<float>(std::log1p(double{x})));
}

TEST_CASE("sincos_f32 accuracy") {
  SinCosErr check;
  SplitMix64 rng{8};
  for (int i = 0; i < 1'500'000; ++i)  // uniform in value over [-2^20, 2^20] (RoPE angles)
    check(static_cast<float>(std::ldexp(static_cast<double>(rng.next() >> 11), -53) * 0x1p21 -
                             0x1p20));
  sweep_bits(-0x1p20f, 0x1p20f, 500'000, 9, check);  // small arguments, every binade
  sweep_bits(0x1p20f, 0x1p40f, 100'000, 10, check);  // rest of the Cody-Waite range
  sweep_consecutive(float_of_bits(0x4e800000u - 20'000), 40'000, check);       // switch at 2^30
  sweep_bits(0x1p30f, std::numeric_limits<float>::max(), 100'000, 11, check);  // Payne-Hanek
  // Near multiples of pi/2, where the reduced argument cancels.
  for (int k = 1; k < 2000; ++k)
    sweep_consecutive(static_cast<float>(k * 1.5707963267948966) * (1 - 0x1p-20f), 40, check);
  CHECK(check.ms.count >= 1'000'000);
  check.check("sincos_f32");
}

TEST_CASE("sincos_f32 special values") {
  float s = 1.0f, c = 0.0f;
  cpd::sincos_f32(0.0f, s, c);
  CHECK(bits_of(s) == 0u);
  CHECK(c == 1.0f);
  cpd::sincos_f32(-0.0f, s, c);
  CHECK(bits_of(s) == bits_of(-0.0f));
  CHECK(c == 1.0f);
  for (float x : {0x1p-149f, -0x1p-149f, 0x1p-126f, 0x1p-30f}) {
    cpd::sincos_f32(x, s, c);
    CHECK(s == x);
    CHECK(c == 1.0f);
  }
  for (float x : {kInf, -kInf, cpd::nan_f32(), float_of_bits(0xff812345u)}) {
    cpd::sincos_f32(x, s, c);
    CHECK(bits_of(s) == kCanonicalNan);
    CHECK(bits_of(c) == kCanonicalNan);
  }
  for (float x : {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 0x1p24f}) {
    cpd::sincos_f32(x, s, c);
    CHECK(ulp_err(s, std::sin(double{x})) <= kSinCosBound);
    CHECK(ulp_err(c, std::cos(double{x})) <= kSinCosBound);
  }
}

TEST_CASE("sincos_2pi_f32 accuracy") {
  SinCos2piErr check;
  for (std::uint32_t k = 0; k < (1u << 23); k += 7) check(k);  // every 7th of the 2^23 inputs
  for (std::uint32_t k = 0; k < 20'000; ++k) check(k);         // u near 0 and 1: s and c tiny
  for (std::uint32_t k = (1u << 23) - 20'000; k < (1u << 23); ++k) check(k);
  CHECK(check.ms.count >= 1'000'000);
  check.check("sincos_2pi_f32");
}

TEST_CASE("sincos_2pi_f32 special values") {
  float s = 1.0f, c = 0.0f;
  cpd::sincos_2pi_f32(0.0f, s, c);
  CHECK(bits_of(s) == 0u);
  CHECK(c == 1.0f);
  cpd::sincos_2pi_f32(0.25f, s, c);
  CHECK(s == 1.0f);
  CHECK(c == 0.0f);
  cpd::sincos_2pi_f32(0.5f, s, c);
  CHECK(s == 0.0f);
  CHECK(c == -1.0f);
  cpd::sincos_2pi_f32(0.75f, s, c);
  CHECK(s == -1.0f);
  CHECK(c == 0.0f);
  cpd::sincos_2pi_f32(0.125f, s, c);  // both sqrt(1/2), correctly rounded
  CHECK(s == 0x1.6a09e6p-1f);
  CHECK(c == 0x1.6a09e6p-1f);
  for (float u : {kInf, -kInf, cpd::nan_f32()}) {
    cpd::sincos_2pi_f32(u, s, c);
    CHECK(bits_of(s) == kCanonicalNan);
    CHECK(bits_of(c) == kCanonicalNan);
  }
}

// The documented maxima, over every input (see the file comment; skipped unless --no-skip).
TEST_CASE("exhaustive maxima of exp, log, log1p, sin/cos and sincos_2pi" * doctest::skip()) {
  ExpErr exp_err;
  LogErr log_err{"log_f32", {}};
  Log1pErr log1p_err{"log1p_f32", {}};
  SinCosErr sincos_err;
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); ++b) {
    const float x = float_of_bits(static_cast<std::uint32_t>(b));
    if (std::isnan(x)) continue;
    if (x >= -104.0f && x <= 89.0f) exp_err(x);  // beyond: exactly 0 or inf (special values)
    if (x > 0.0f && !std::isinf(x)) log_err(x);
    if (x > -1.0f && !std::isinf(x)) log1p_err(x);
    if (!std::signbit(x) && !std::isinf(x)) sincos_err(x);
  }
  exp_err.check();
  log_err.check(kLogBound);
  log1p_err.check(kLog1pBound);
  sincos_err.check("sincos_f32");
  SinCos2piErr sincos_2pi_err;
  for (std::uint32_t k = 0; k < (1u << 23); ++k) sincos_2pi_err(k);
  sincos_2pi_err.check("sincos_2pi_f32");
}

// The exact output bits over a fixed sweep. The functions are fixed IEEE operation sequences, so
// every conforming build (any -O level, with or without hardware FMA, and the CUDA backend) must
// reproduce this checksum. If the algorithms change on purpose, update the constant.
TEST_CASE("fmath output bits are build-independent") {
  std::uint64_t h = 0xcbf29ce484222325ull;
  SplitMix64 rng{12};
  for (int i = 0; i < 200'000; ++i) {
    const float x = float_of_bits(static_cast<std::uint32_t>(rng.next()));
    float s = 0.0f, c = 0.0f;
    h = fnv1a(h, bits_of(cpd::exp_f32(x)));
    h = fnv1a(h, bits_of(cpd::log_f32(x)));
    h = fnv1a(h, bits_of(cpd::log1p_f32(x)));
    cpd::sincos_f32(x, s, c);
    h = fnv1a(h, bits_of(s));
    h = fnv1a(h, bits_of(c));
    cpd::sincos_2pi_f32(static_cast<float>((2.0 * (i & 0x7fffff) + 1.0) * 0x1p-24), s, c);
    h = fnv1a(h, bits_of(s));
    h = fnv1a(h, bits_of(c));
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%016llx", static_cast<unsigned long long>(h));
  MESSAGE("fmath output checksum: " << hex);
  CHECK(h == 0x1def6476b491c69eull);
}
