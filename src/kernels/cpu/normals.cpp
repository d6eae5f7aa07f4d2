// Standard normals a row at a time (src/kernels/cpu/normals.h).
//
// Each loop calls the canonical functions of cpdrift/philox.h on one block or pair per
// iteration, and GCC vectorises it (16 lanes on AVX-512: several times faster than a call of
// normal4 per block). That takes three things: `flatten`, so that log_f32 and sincos_2pi_f32 are
// inlined into the loop; -fno-trapping-math, so that their selects become masked lanes instead
// of branches; and -fno-math-errno, so that std::sqrt is the bare instruction. meson.build
// compiles this file alone with the two options. Neither changes a value: they concern FP
// exceptions and errno, while contraction stays off (-ffp-contract=off) and no operation is
// reordered. tests/test_inputs.cpp holds the vectorised results to normal4's and box_muller's
// bits over every value a Philox word gives the radius and the angle.
#include "kernels/cpu/normals.h"

#include <algorithm>

namespace cpd {

__attribute__((flatten)) void box_muller_pairs(const std::uint32_t* __restrict words,
                                               std::int64_t pairs, float* __restrict out) {
  for (std::int64_t i = 0; i < pairs; ++i) {
    float x, y;
    box_muller(words[2 * i], words[2 * i + 1], x, y);
    out[2 * i] = x;
    out[2 * i + 1] = y;
  }
}

__attribute__((flatten)) void normal_blocks(std::uint64_t seed, TensorId tensor,
                                            std::uint64_t first, std::int64_t blocks, float* out) {
  constexpr std::int64_t kBatch = 64;  // blocks whose words stay on the stack (1 KiB)
  std::uint32_t words[4 * kBatch];
  for (std::int64_t b0 = 0; b0 < blocks; b0 += kBatch) {
    const std::int64_t n = std::min(kBatch, blocks - b0);
    for (std::int64_t i = 0; i < n; ++i) {
      const Philox4x32 r = philox_block(seed, tensor, first + static_cast<std::uint64_t>(b0 + i));
      for (int w = 0; w < 4; ++w) words[4 * i + w] = r.v[w];
    }
    box_muller_pairs(words, 2 * n, out + 4 * b0);
  }
}

}  // namespace cpd
