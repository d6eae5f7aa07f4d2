// BF16 round-to-nearest-even against an independent oracle built from FP64 distances.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "cpdrift/bf16.h"

namespace {

using cpd::bf16_bits_rn;
using cpd::bf16_bits_rn_select;
using cpd::bits_of;
using cpd::float_of_bits;

// The oracle: the two BF16 neighbours of x (truncation and the next pattern up in magnitude),
// whichever is nearer in exact FP64 arithmetic; a tie goes to the even pattern. Values past
// the largest BF16's rounding boundary become inf.
std::uint16_t oracle(float x) {
  const std::uint32_t u = bits_of(x);
  if (std::isnan(x)) return 0;  // checked separately
  if (std::isinf(x)) return static_cast<std::uint16_t>(u >> 16);
  const auto lo = static_cast<std::uint16_t>(u >> 16);
  const auto hi = static_cast<std::uint16_t>(lo + 1);
  const double v = std::fabs(static_cast<double>(x));
  const double a =
      std::fabs(static_cast<double>(float_of_bits(static_cast<std::uint32_t>(lo) << 16)));
  const double b_bits =
      std::fabs(static_cast<double>(float_of_bits(static_cast<std::uint32_t>(hi) << 16)));
  // hi of the largest finite BF16 (0x7f7f) is 0x7f80 = inf: its "value" for rounding is 2^128.
  const double b = (hi & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128) : b_bits;
  const double da = v - a, db = b - v;
  if (da < db) return lo;
  if (db < da) return hi;
  return (lo & 1) == 0 ? lo : hi;
}

}  // namespace

TEST_CASE("bf16: hand-checked values") {
  CHECK(bf16_bits_rn(1.0f) == 0x3f80);
  CHECK(bf16_bits_rn(-2.0f) == 0xc000);
  CHECK(bf16_bits_rn(float_of_bits(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(bf16_bits_rn(float_of_bits(0x3f818000u)) == 0x3f82);  // tie, odd rounds up to even
  CHECK(bf16_bits_rn(float_of_bits(0x3f808001u)) == 0x3f81);  // just above the tie
  CHECK(bf16_bits_rn(float_of_bits(0x3f807fffu)) == 0x3f80);  // just below the tie
  CHECK(bf16_bits_rn(float_of_bits(0x7f7fffffu)) == 0x7f80);  // FLT_MAX overflows to inf
  CHECK(bf16_bits_rn(float_of_bits(0xff7fffffu)) == 0xff80);
  CHECK(bf16_bits_rn(float_of_bits(0x7f800000u)) == 0x7f80);  // inf stays inf
  CHECK(bf16_bits_rn(-0.0f) == 0x8000);
  CHECK(bf16_bits_rn(float_of_bits(0x00008000u)) == 0x0000);  // denormal tie to even (zero)
  CHECK(bf16_bits_rn(float_of_bits(0x00018000u)) == 0x0002);
}

TEST_CASE("bf16: NaN stays NaN and quiet, never becomes inf") {
  for (std::uint32_t u : {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u, 0x7f80ffffu}) {
    const std::uint16_t b = bf16_bits_rn(float_of_bits(u));
    CHECK((b & 0x7f80) == 0x7f80);
    CHECK((b & 0x007f) != 0);                     // still a NaN
    CHECK((b & 0x0040) != 0);                     // quiet
    CHECK((b & 0x8000) == ((u >> 16) & 0x8000));  // sign kept
  }
}

TEST_CASE("bf16: matches the FP64-distance oracle over a sweep of all bit patterns") {
  // Every 251st pattern (prime stride: every exponent, mantissa residue and sign is hit), plus
  // every pattern whose low 16 bits sit at or next to the rounding boundary.
  std::uint64_t mismatches = 0, checked = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 251) {
    const float x = float_of_bits(static_cast<std::uint32_t>(u));
    if (std::isnan(x)) continue;
    ++checked;
    if (bf16_bits_rn(x) != oracle(x)) ++mismatches;
  }
  for (std::uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (std::uint32_t lo : {0x7ffeu, 0x7fffu, 0x8000u, 0x8001u}) {
      const float x = float_of_bits((hi << 16) | lo);
      if (std::isnan(x)) continue;
      ++checked;
      if (bf16_bits_rn(x) != oracle(x)) ++mismatches;
    }
  }
  CHECK(checked > 17000000);
  CHECK(mismatches == 0);
}

TEST_CASE("bf16: the branch-free form equals bf16_bits_rn") {
  // Every NaN and inf pattern (exponent all ones, both signs), every 251st pattern, and every
  // pattern at or next to the rounding boundary (the vectorised digest and statistics passes
  // use it). Control: a form that forgets to quiet NaNs differs on signalling ones.
  std::uint64_t mismatches = 0, unquieted_differs = 0, checked = 0;
  const auto check = [&](std::uint32_t bits) {
    const std::uint32_t got = bf16_bits_rn_select(bits);
    mismatches += got != bf16_bits_rn(float_of_bits(bits)) ? 1 : 0;
    unquieted_differs += got != ((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16) ? 1 : 0;
    ++checked;
  };
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::uint32_t m = 0; m < 0x800000u; ++m) check(sign | 0x7f800000u | m);
  }
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 251) check(static_cast<std::uint32_t>(u));
  for (std::uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (std::uint32_t lo : {0x7ffeu, 0x7fffu, 0x8000u, 0x8001u}) check((hi << 16) | lo);
  }
  CHECK(checked > 33000000);
  CHECK(mismatches == 0);
  CHECK(unquieted_differs > 0);
}
