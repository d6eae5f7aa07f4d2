// The passes of the drift statistics over the data (metrics/diff_stats.cpp), and what they
// share with the radix select that reads their counters. Internal to the metrics library.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "metrics/diff_stats.h"

namespace cpd::diff_passes {

inline std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
inline float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

// The FP32 order as unsigned integers, -0 and +0 the same: the distance of two keys is the
// ulp_distance of their floats (below 2^32). Without branches: m + 2^31 for a positive value,
// 2^31 - m for a negative one (m: the magnitude bits).
inline std::uint32_t order_key(std::uint32_t u) {
  const std::uint32_t sign = u >> 31, m = u & 0x7fffffffu;
  return 0x80000000u + ((m ^ (0u - sign)) + sign);
}

// The radix select's levels (diff_stats.h): bits [31, 21), then [21, 10), then [10, 0) of the
// non-negative diffs, small histograms (16 KiB a level) so that a small tensor's are cheap.
constexpr int kLevels = 3;
constexpr int kLevelShift[kLevels] = {21, 10, 0};
constexpr int kLevelBits[kLevels] = {11, 11, 10};
constexpr std::size_t kBins = std::size_t{1} << kLevelBits[0];

constexpr std::size_t level_bins(int level) { return std::size_t{1} << kLevelBits[level]; }

// Exact sum of non-negative finite FP32 values: each value is mantissa · 2^(exponent - 150)
// with a 24-bit integer mantissa, so summing mantissas per exponent in 64-bit integers is
// exact for up to 2^40 values per exponent, and the bins add exactly across parts. Bin e
// weighs 2^(max(e - 1, 0)) units of 2^-149, like FP32's biased exponent e. A block whose
// values span few binades is summed first (an exact 64-bit integer) and added to three bins as
// 24-bit pieces, the highest 48 bins above FP32's largest exponent: hence 256 + 48 bins.
constexpr std::size_t kFp32Exponents = 256;
constexpr std::size_t kExponents = kFp32Exponents + 48;

// The passes run over blocks of kBlock values (see diff_passes.cpp).
inline constexpr std::size_t kBlock = 32;

// Counters of the first pass, laid out as one vector so one reduction combines them all.
struct FirstPass {
  // kZeros: the diffs that are +0 (exact matches), kept out of the histograms.
  enum : std::size_t { kCount, kMismatch, kNonfinite, kZeros, kHeader };
  std::vector<std::uint64_t> v = std::vector<std::uint64_t>(kHeader + kExponents + kBins, 0);
  std::uint64_t& operator[](std::size_t i) { return v[i]; }
  std::span<std::uint64_t> sum_bins() { return {v.data() + kHeader, kExponents}; }
  std::span<std::uint64_t> hist() { return {v.data() + kHeader + kExponents, kBins}; }
};

/// The bins' total Σ bins[e]·2^(max(e-1, 0)) in units of 2^-149, as a 384-bit integer (the
/// largest term is below 2^(302+64); the total, below 2^64 values of at most 2^277 units, too),
/// rounded once to the nearest FP64 (ties to even).
double sum_from_bins(std::span<const std::uint64_t> bins);

// The unit of parallel work: consecutive pieces of parts, about `size` elements in all, so
// that many small parts share one set of histograms.
struct Piece {
  const DiffPart* part;
  std::size_t begin, end;
};
using Chunk = std::vector<Piece>;

struct LocalFirst {
  FirstPass counters;  // its bins are filled from the ways below by close()
  std::uint64_t max_bits = 0, max_ulp = 0;
  // The bins as the first pass fills them, each with one more slot for what it does not count
  // (exact matches in both, non-finite diffs in the sums), so that the loop has no branch.
  // Value k of a block goes to way k % kWays: neighbouring diffs tend to share a bin, and one
  // set of bins would make each increment wait for the previous one's store. The counters are
  // integers, so the ways add up to the same figures in any order.
  static constexpr std::size_t kWays = 4;
  std::array<std::array<std::uint64_t, kBins + 1>, kWays> hist{};
  std::array<std::array<std::uint64_t, kExponents + 1>, kWays> sums{};

  void close() {
    const std::span<std::uint64_t> h = counters.hist(), s = counters.sum_bins();
    for (std::size_t w = 0; w < kWays; ++w) {
      for (std::size_t i = 0; i < kBins; ++i) h[i] += hist[w][i];
      for (std::size_t i = 0; i < kExponents; ++i) s[i] += sums[w][i];
    }
  }
};

/// The first pass over a piece: counts, maxima, the exact sum's bins and the top-level
/// histogram (exact matches, the common case of the invariance checks, are only counted).
void first_pass(const Piece& c, LocalFirst& acc);

/// The second pass over a piece: every nonzero diff whose top-level bin is one of `bins` (at
/// most 8), written at out[count++] (its bits, a non-negative float); `out` needs kBlock slots
/// past the last kept diff.
void collect(const Piece& c, std::span<const std::uint32_t> bins, float* out, std::size_t& count);

/// A later level's histogram from the data itself: every nonzero diff whose bits above `level`
/// are one of `prefixes` (at most 4, distinct), counted at its bin of the level in h
/// ([prefixes][level_bins(level)]).
void level_pass(const Piece& c, int level, std::span<const std::uint32_t> prefixes,
                std::uint64_t* h);

}  // namespace cpd::diff_passes
