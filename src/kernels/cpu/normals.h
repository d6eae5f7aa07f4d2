// The CPU's generation of standard normals: whole rows of Philox blocks at a time, the same
// operations as normal4 (cpdrift/philox.h) lane by lane, so the same bits, vectorised by the
// compiler (src/kernels/cpu/normals.cpp says how).
#pragma once

#include <cstdint>

#include "cpdrift/philox.h"

namespace cpd {

/// normal4 of blocks first … first + blocks - 1 of `tensor`, in order: 4·blocks floats.
void normal_blocks(std::uint64_t seed, TensorId tensor, std::uint64_t first, std::int64_t blocks,
                   float* out);

/// box_muller of each pair of words: out[2i], out[2i + 1] from words[2i], words[2i + 1].
void box_muller_pairs(const std::uint32_t* words, std::int64_t pairs, float* out);

}  // namespace cpd
