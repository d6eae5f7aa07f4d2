#include "cpdrift/cpu/simd_info.h"

#include "simd16.h"

namespace cpd {
const char* cpu_simd_isa() { return simd::isa(); }
}  // namespace cpd
