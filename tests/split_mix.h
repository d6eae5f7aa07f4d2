// Test support: SplitMix64, a small seeded generator of 64-bit patterns for the sweeps over
// inputs (the same sequence on every platform, unlike the standard distributions).
#pragma once

#include <cstdint>

namespace cpd::testing {

struct SplitMix64 {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// A double in [lo, hi) from the top 53 bits.
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1p-53;
  }
};

}  // namespace cpd::testing
