// Timing the CPU kernels on the CP=1 problem, for `cpdrift bench` and the CPU profile of
// `cpdrift plan`.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/shard.h"
#include "core/util/thread_pool.h"
#include "cpdrift/attention_math.h"
#include "engine/paged/paged_cache.h"
#include "kernels/cpu/inputs.h"

namespace cpd::kernel_timing {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Inputs {
  Shard q, k, v;
};

/// The whole problem's q, k and v under `precision`.
Inputs make_inputs(const Problem& p, InputPrecision precision, ThreadPool& pool);

/// Sorted seconds of `repeats` CP=1 prefill forwards (a single KV block [0, S)), the FP32
/// reference's work, each into a fresh `out`. With `cache`, K and V are read in place from its
/// pages.
std::vector<double> time_forward(const Problem& p, const Inputs& in, ProbRounding rounding,
                                 int repeats, ThreadPool& pool, AttnShard& out,
                                 const PagedKvCache* cache = nullptr);

/// Seconds of `repeats` runs of `run` (sorted); `run` returns its own time.
template <class Run>
std::vector<double> times_of(int repeats, Run&& run) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) times.push_back(run());
  std::sort(times.begin(), times.end());
  return times;
}

/// Sorted seconds of `repeats` CP=1 backwards (one block pair [0, S) × [0, S) per head) from
/// the forward's out and lse.
std::vector<double> time_backward(const Problem& p, const Inputs& in, const AttnShard& fwd,
                                  int repeats, ThreadPool& pool);

/// FLOPs of one causal forward as the bench counts them: 2·2·B·Hq·D·S²/2.
double forward_flops(const Problem& p);

}  // namespace cpd::kernel_timing
