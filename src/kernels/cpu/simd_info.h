// The CPU kernel's SIMD: which implementation the build selected, and what the host's FMA units
// deliver with it (the yardstick `cpdrift bench` measures the kernels against).
#pragma once

#include "core/util/thread_pool.h"

namespace cpd {

/// "avx512", "avx2" or "scalar".
const char* cpu_simd_isa();

/// FP32 FLOP/s of independent fused multiply-adds (two FLOPs each) with the kernel's 16-lane
/// vectors, on every thread of `pool` for about `seconds`: the peak the kernels can approach.
double measure_fma_peak(ThreadPool& pool, double seconds = 0.25);

}  // namespace cpd
