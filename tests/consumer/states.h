// The states both sides of the installed-header test merge: a fixed, seeded set of partial
// attention states (out, lse, block index) of one query range, in a shuffled arrival order, with
// lse = -inf rows (blocks a row cannot see) among them. Needs nothing but the standard library.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace consumer {

inline constexpr int kStates = 7, kRows = 5, kDim = 64, kCp = 4;

struct States {
  std::vector<std::vector<float>> out, lse;  // per state: [rows][dim], [rows]
  std::vector<int> block_index;              // per state, in arrival order (shuffled)
};

// A 64-bit LCG's top bits as a float in [-1, 1).
inline float next(std::uint64_t& s) {
  s = s * 6364136223846793005ULL + 1442695040888963407ULL;
  return static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) / (1 << 23);
}

/// `flip`: one bit of one input changed (the test's negative control).
inline States make_states(bool flip) {
  States st;
  std::uint64_t seed = 2355;
  for (int i = 0; i < kStates; ++i) {
    st.block_index.push_back((i * 5 + 3) % kStates);  // a permutation of 0 .. kStates-1
    std::vector<float> out(kRows * kDim), lse(kRows);
    for (float& x : out) x = next(seed);
    for (int r = 0; r < kRows; ++r)
      lse[r] = (r + i) % 4 == 0 ? -std::numeric_limits<float>::infinity() : 3.0f * next(seed);
    st.out.push_back(out);
    st.lse.push_back(lse);
  }
  if (flip) st.out[2][17] = -st.out[2][17];  // its sign bit
  return st;
}

}  // namespace consumer
