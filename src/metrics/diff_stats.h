// Drift statistics of a candidate tensor against a reference (design §5), exact and
// distributable: every quantity combines across parts and processes without gathering the
// tensors and without depending on how the tensor was cut.
//
//   diff_i  = 0 if c_i == r_i (so -inf vs -inf is 0), else |c_i - r_i| in FP32
//   max_abs, mean_abs (the exact sum of the FP32 diffs rounded once to FP64, then divided
//   by n in FP64), p95/p99 (linear interpolation at q·(n-1) of the sorted diffs, as
//   torch.quantile), active_count = n,
//   mismatch_count (bit patterns differ), max_ulp (distance in FP32 representation order).
//
// Non-negative FP32 values sort like their bit patterns, so the order statistics come from a
// radix select over three histogram passes of 11, 11 and 10 bits (merged by addition across
// parts).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/collectives.h"

namespace cpd {

class ThreadPool;

/// One local piece of a compared tensor. Either (candidate, reference) pairs, or precomputed
/// non-negative FP32 differences (`reference == nullptr`), e.g. against an FP64 oracle.
/// `bf16_candidate`: each candidate value is read rounded once to BF16 (a final write taken
/// without storing it).
struct DiffPart {
  const float* candidate = nullptr;
  const float* reference = nullptr;
  std::size_t count = 0;
  bool bf16_candidate = false;
};

struct DiffStats {
  double max_abs = 0.0;
  double mean_abs = 0.0;
  double p95_abs = 0.0;
  double p99_abs = 0.0;
  std::uint64_t active_count = 0;
  std::uint64_t mismatch_count = 0;
  std::uint64_t max_ulp = 0;
  std::uint64_t nonfinite_count = 0;  // diffs that are inf or NaN: the stats are then invalid
  std::optional<std::string> digest;  // SHA-256 of the candidate in global order, when taken

  bool bitwise_equal() const { return mismatch_count == 0 && nonfinite_count == 0; }
  bool finite() const { return nonfinite_count == 0; }
};

/// Distance between two floats in units in the last place: how many representable FP32
/// values lie between them (+0 and -0 are 0 apart; NaN anywhere gives UINT64_MAX).
std::uint64_t ulp_distance(float a, float b);

/// Computes the statistics of the tensor made of `parts` (this process's pieces; `reduce`
/// sums counters with the other holders). Every holder must call it with the same sequence
/// of reductions, i.e. collectively; all of them get the same result.
/// `pool` spreads the local passes over threads; integer counters make the result exact and
/// independent of that.
DiffStats compute_diff_stats(std::span<const DiffPart> parts,
                             const CounterReducer& reduce = CounterReducer{},
                             ThreadPool* pool = nullptr);

/// The statistics of the tensor made of `parts` and, from the same passes over the data, of
/// each of `groups` subsets of it (part i is in group group_of[i]; a part whose group is not in
/// [0, groups) counts toward the whole only). Returns the whole's, then group 0's, 1's, …: each
/// exactly what compute_diff_stats gives for those parts alone, since every counter is an
/// integer and the groups' add up to the whole's. Collective like compute_diff_stats, with the
/// same `groups` on every holder.
std::vector<DiffStats> compute_grouped_diff_stats(std::span<const DiffPart> parts,
                                                  std::span<const int> group_of, int groups,
                                                  const CounterReducer& reduce = CounterReducer{},
                                                  ThreadPool* pool = nullptr);

/// Linear-interpolation quantile of already sorted values (the definition, for tests and
/// small data; torch.quantile's and numpy's default): v[lo] + (v[hi] - v[lo])·frac at position
/// q·(n-1), in FP64; 0 for no values.
template <typename Sorted>
double sorted_quantile(const Sorted& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const double a = sorted[lo], b = sorted[std::min(lo + 1, sorted.size() - 1)];
  return a + (b - a) * (pos - static_cast<double>(lo));
}

}  // namespace cpd
