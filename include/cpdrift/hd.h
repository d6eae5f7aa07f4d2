// Host/device portability for the arithmetic shared by the CPU and CUDA backends.
//
// Everything under include/cpdrift/numerics/ compiles with the host compiler alone and with
// nvcc. The FP32 reference path depends on these functions producing the same bits on both
// sides, so they use only IEEE-754 operations with a single rounding each (+, -, *, /, sqrt,
// explicit fma) and integer bit manipulation: no libm, no contraction, no lookup tables that
// the two compilers could evaluate differently.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CPD_HD __host__ __device__ __forceinline__
#else
#define CPD_HD inline
#endif

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace cpd {

/// Fused multiply-add with a single rounding, on host and device.
CPD_HD float fma_f32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

CPD_HD double fma_f64(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

CPD_HD std::uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

CPD_HD float float_of_bits(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

CPD_HD std::uint64_t bits_of(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint64_t>(__double_as_longlong(x));
#else
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

CPD_HD double double_of_bits(std::uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/// Correctly rounded square root (IEEE-754 requires it; nvcc's default -prec-sqrt=true too).
CPD_HD float sqrt_f32(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

/// +inf and -inf without <limits> (which nvcc device code handles unevenly).
CPD_HD float inf_f32() { return float_of_bits(0x7f800000u); }
CPD_HD float neg_inf_f32() { return float_of_bits(0xff800000u); }
CPD_HD float nan_f32() { return float_of_bits(0x7fc00000u); }

CPD_HD double nan_f64() { return double_of_bits(0x7ff8000000000000ull); }

CPD_HD bool is_nan_f32(float x) { return (bits_of(x) & 0x7fffffffu) > 0x7f800000u; }
CPD_HD bool is_nan_f64(double x) {
  return (bits_of(x) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}
CPD_HD bool is_finite_f32(float x) { return (bits_of(x) & 0x7f800000u) != 0x7f800000u; }

}  // namespace cpd
