// exp_f64 (include/cpdrift/fmath.h) against long double expl, and its special values.
//
// Errors are in units of the double spacing at the reference (2^-1074 below 2^-1022). The
// reference is x87 expl: 64-bit significand, within about 1 ulp of it, i.e. 2^-11 double ulp.
// The bounds come from the error analysis below (fmath.h's comment on exp_f64 gives the
// sequence); the sampled maxima sit under them (0.66-0.69 and 0.77 here).
// - Normal results: the final rounding of p (0.5 ulp) plus the errors of the tail that p adds
//   to s, in units of 2^-53: r's rounding through r^2 q (0.10), r·r's (0.04), the polynomial's
//   roundings (0.13), the tail's own (0.06) and the Taylor terms left out (0.04), 0.36 in all:
//   0.86 ulp where p < 1 (its ulp is 2^-53), 0.68 above.
// - Results below 2^-1021: that p, scaled exactly by 2^h, then rounded once more to the grid of
//   the result, which is p's spacing there (the rounding is exact: 0.86 ulp) or coarser (at
//   most 0.5 + 0.86 / 2 = 0.93 ulp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "cpdrift/fmath.h"
#include "split_mix.h"

namespace {

using cpd::bits_of;
using cpd::double_of_bits;
using cpd::testing::SplitMix64;

constexpr double kExp64Bound = 0.86;
constexpr double kExp64LowBound = 0.93;  // results below 2^-1021
constexpr std::uint64_t kCanonicalNan64 = 0x7ff8000000000000ull;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The double spacing at `ref`: 2^(floor(log2 |ref|) - 52), never below 2^-1074.
long double ulp_of(long double ref) {
  const int e = ilogbl(ref);
  return ldexpl(1.0L, e - 52 < -1074 ? -1074 : e - 52);
}

struct Exp64Err {
  double normal = 0, low = 0, normal_at = 0, low_at = 0;
  long count = 0;
  void operator()(double x) {
    const long double ref = expl(static_cast<long double>(x));
    if (ref > static_cast<long double>(std::numeric_limits<double>::max())) return;  // overflow
    const double y = cpd::exp_f64(x);
    const double err = static_cast<double>(fabsl(static_cast<long double>(y) - ref) / ulp_of(ref));
    const bool low_result = ref < 0x1p-1021L;
    double& worst = low_result ? low : normal;
    double& at = low_result ? low_at : normal_at;
    if (err > worst || std::isnan(err)) {
      worst = err;
      at = x;
    }
    ++count;
  }
};

std::string describe(double err, double at) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.4f ulp at %a (%.17g)", err, at, at);
  return buf;
}

}  // namespace

TEST_CASE("exp_f64 accuracy") {
  Exp64Err e;
  SplitMix64 rng{5};
  for (int i = 0; i < 2'000'000; ++i) e(rng.uniform(-746.0, 710.0));  // the whole domain
  for (int i = 0; i < 500'000; ++i) e(rng.uniform(-0x1p-3, 0x1p-3));  // near 0
  for (int i = 0; i < 500'000; ++i) e(rng.uniform(-745.2, -707.0));   // subnormal results
  for (int i = 0; i < 500'000; ++i) e(rng.uniform(-20.0, 0.0));       // the KL's arguments
  // The reduction's edges, where n = round(x / ln2) changes: (k + 1/2) ln2 and the 8 doubles
  // on either side.
  for (int k = -1076; k <= 1024; ++k) {
    double x = (k + 0.5) * 0x1.62e42fefa39efp-1;
    for (int j = 0; j < 8; ++j) x = std::nextafter(x, -kInf);
    for (int j = 0; j < 17; ++j, x = std::nextafter(x, kInf)) e(x);
  }
  MESSAGE("exp_f64 max error, normal results: " << describe(e.normal, e.normal_at));
  MESSAGE("exp_f64 max error, results below 2^-1021: " << describe(e.low, e.low_at) << "; "
                                                       << e.count << " inputs");
  CHECK(e.count > 3'000'000);
  CHECK(e.normal <= kExp64Bound);
  CHECK(e.low <= kExp64LowBound);
}

TEST_CASE("exp_f64 special values") {
  CHECK(bits_of(cpd::exp_f64(0.0)) == bits_of(1.0));
  CHECK(bits_of(cpd::exp_f64(-0.0)) == bits_of(1.0));
  CHECK(bits_of(cpd::exp_f64(-kInf)) == 0u);  // +0, not -0
  CHECK(cpd::exp_f64(kInf) == kInf);
  CHECK(bits_of(cpd::exp_f64(cpd::nan_f64())) == kCanonicalNan64);
  CHECK(bits_of(cpd::exp_f64(double_of_bits(0xfff0000000012345ull))) == kCanonicalNan64);
  CHECK(cpd::exp_f64(std::numeric_limits<double>::max()) == kInf);
  CHECK(bits_of(cpd::exp_f64(-std::numeric_limits<double>::max())) == 0u);
  for (double x : {0x1p-1074, 0x1p-60, -0x1p-1074, -0x1p-60})
    CHECK(cpd::exp_f64(x) == 1.0);  // e^x = 1 + x rounds to 1
  // Overflow at ln(DBL_MAX + half ulp) = 709.782712893384: the double below it is finite.
  const double edge = 0x1.62e42fefa39efp+9;  // 709.782712893383973
  CHECK(std::isfinite(cpd::exp_f64(edge)));
  CHECK(cpd::exp_f64(std::nextafter(edge, kInf)) == kInf);
  CHECK(cpd::exp_f64(709.8) == kInf);
  // Underflow: e^x rounds to 0 below 2^-1075, i.e. x < -1075 ln2 = -745.1332191019412.
  CHECK(cpd::exp_f64(-745.13) == 0x1p-1074);
  CHECK(bits_of(cpd::exp_f64(-745.14)) == 0u);
  CHECK(bits_of(cpd::exp_f64(-746.0)) == 0u);
  CHECK(bits_of(cpd::exp_f64(-1e300)) == 0u);
  CHECK(cpd::exp_f64(1.0) == 0x1.5bf0a8b145769p+1);  // e, correctly rounded
}

// exp_f64 is a fixed IEEE operation sequence: its bits over a fixed sweep must not depend on
// the build (optimisation level, vectorisation). If the algorithm changes on purpose, update
// the constant.
TEST_CASE("exp_f64 output bits are build-independent") {
  std::uint64_t h = 0xcbf29ce484222325ull;
  SplitMix64 rng{13};
  for (int i = 0; i < 200'000; ++i) {
    const std::uint64_t b = bits_of(cpd::exp_f64(rng.uniform(-750.0, 712.0)));
    for (int k = 0; k < 8; ++k) h = (h ^ ((b >> (8 * k)) & 0xffu)) * 0x100000001b3ull;
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%016llx", static_cast<unsigned long long>(h));
  CHECK(std::string(hex) == "0xfad50ce0dea1bc92");
}
