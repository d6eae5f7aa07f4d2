// Which SIMD implementation the CPU kernel was built with ("avx512", "avx2", "scalar").
#pragma once

namespace cpd {
const char* cpu_simd_isa();
}
