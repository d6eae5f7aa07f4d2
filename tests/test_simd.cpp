// The CPU kernel's 16-lane math against the scalar definitions, bit for bit, over a sweep of
// float bit patterns (every 61st pattern: all exponents, signs, NaNs, infinities, denormals).
#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/cpu/simd16_math.h"

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

// exp's clamp and scaling in their generic forms (compares and selects; two products), whatever
// this build's 16-lane type does instead.
struct GenericLanes : Lanes<simd::F16> {
  static F clamp(F x, float lo, float hi) {
    return fmath_detail::clamp_by_selects<GenericLanes>(x, lo, hi);
  }
  static F scale(F p, F, I n) { return fmath_detail::scale_by_products<GenericLanes>(p, n); }
};

// A wrong scaling for the control: p·2^n in one product, whose 2^n is not a normal float below
// n = -126, so results under 2^-126 differ.
struct OneProductLanes : Lanes<simd::F16> {
  static F scale(F p, F, I n) {
    return simd::mul(p, simd::from_bits(simd::shl<23>(simd::iadd(n, simd::isplat(127)))));
  }
};

// Whether `lanes_exp` gives other bits than simd::exp for some input whose bit pattern is in
// [begin, end): the lanes' bit differences OR-ed together, 16 inputs a step.
template <class Exp>
bool any_mismatch(Exp lanes_exp, std::uint64_t begin, std::uint64_t end) {
  alignas(64) std::int32_t start[16];
  for (int i = 0; i < 16; ++i) start[i] = i;
  const simd::I16 lane = simd::bits(simd::load(reinterpret_cast<const float*>(start)));
  simd::I16 differ = simd::isplat(0);
  for (std::uint64_t base = begin; base < end; base += 16) {
    const simd::F16 x = simd::from_bits(simd::iadd(
        simd::isplat(static_cast<std::int32_t>(static_cast<std::uint32_t>(base))), lane));
    differ = simd::ior(differ, simd::isub(simd::bits(simd::exp(x)), simd::bits(lanes_exp(x))));
  }
  alignas(64) float out[16];
  simd::store(out, simd::from_bits(differ));
  for (const float f : out) {
    if (bits_of(f) != 0) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("16-lane exp equals its generic sequence on all 2^32 inputs") {
  // The build's clamp and scaling (on AVX-512: vmaxps/vminps and vscalefps) against the generic
  // forms; the control shows a wrong scaling is caught over x in [-104, -88) (patterns
  // 0xc2b00000 to 0xc2d00000), whose results are subnormal.
  MESSAGE("SIMD implementation: " << std::string(simd::isa()));
  CHECK_FALSE(any_mismatch([](simd::F16 x) { return exp_lanes<simd::F16, GenericLanes>(x); }, 0,
                           std::uint64_t{1} << 32));
  CHECK(any_mismatch([](simd::F16 x) { return exp_lanes<simd::F16, OneProductLanes>(x); },
                     0xc2b00000u, 0xc2d00000u));
}

TEST_CASE("16-lane exp equals exp_f32 bit for bit") {
  MESSAGE("SIMD implementation: " << std::string(simd::isa()));
  CHECK(sweep_mismatches([](float x) { return exp_f32(x); },
                         [](simd::F16 x) { return simd::exp(x); }) == 0);
}

TEST_CASE("16-lane BF16 rounding equals round_bf16 bit for bit") {
  CHECK(sweep_mismatches([](float x) { return round_bf16(x); },
                         [](simd::F16 x) { return simd::round_bf16(x); }) == 0);
}

TEST_CASE("16-column transpose equals the element-wise one for 0 to 16 rows") {
  // Rows 20 floats apart, every value distinct; the output starts as garbage so that the zeroed
  // lanes past the rows are checked too.
  std::vector<float> rows(16 * 20);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i) + 0.5f;
  for (int nrows = 0; nrows <= 16; ++nrows) {
    std::vector<float> out(256, -1.0f), expected(256, 0.0f);
    for (int r = 0; r < nrows; ++r) {
      for (int c = 0; c < 16; ++c) expected[c * 16 + r] = rows[r * 20 + c];
    }
    simd::transpose16(rows.data(), nrows, 20, out.data());
    CHECK_MESSAGE(out == expected, nrows << " rows");
  }
}
