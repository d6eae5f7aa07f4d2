// The CPU kernel's 16-lane math against the scalar definitions, bit for bit, over a sweep of
// float bit patterns (every 61st pattern: all exponents, signs, NaNs, infinities, denormals).
#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>

#include "../src/cpu/simd16_math.h"

using namespace cpd;

namespace {

template <class Scalar, class Vector>
std::uint64_t sweep_mismatches(Scalar scalar, Vector vector) {
  std::uint64_t mismatches = 0;
  alignas(64) float in[16], out[16];
  int lane = 0;
  const auto flush = [&] {
    simd::store(out, vector(simd::load(in)));
    for (int i = 0; i < lane; ++i) mismatches += bits_of(out[i]) != bits_of(scalar(in[i]));
    lane = 0;
  };
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 61) {
    in[lane++] = float_of_bits(static_cast<std::uint32_t>(u));
    if (lane == 16) flush();
  }
  for (std::uint32_t u : {0x0u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x42b17217u, 0x42b17218u,
                          0xc2cff1b4u, 0xc2cff1b5u, 0x7fc00001u, 0x3f808000u, 0x3f818000u}) {
    in[lane++] = float_of_bits(u);
    if (lane == 16) flush();
  }
  for (int i = lane; i < 16; ++i) in[i] = 0.0f;
  flush();
  return mismatches;
}

}  // namespace

TEST_CASE("16-lane exp equals exp_f32 bit for bit") {
  MESSAGE("SIMD implementation: " << simd::isa());
  CHECK(sweep_mismatches([](float x) { return exp_f32(x); },
                         [](simd::F16 x) { return simd::exp(x); }) == 0);
}

TEST_CASE("16-lane BF16 rounding equals round_bf16 bit for bit") {
  CHECK(sweep_mismatches([](float x) { return round_bf16(x); },
                         [](simd::F16 x) { return simd::round_bf16(x); }) == 0);
}
