#include "kernels/cpu/simd_info.h"

#include <chrono>
#include <vector>

#include "kernels/cpu/simd16.h"

namespace cpd {
namespace {

using Clock = std::chrono::steady_clock;

// Twelve independent chains: enough to cover the FMA latency of two units.
constexpr int kChains = 12;

// `steps` × kChains 16-lane FMAs; the result lands in `sink` so that no chain is dead code.
void fma_chains(long long steps, float* sink) {
  simd::F16 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = simd::splat(1.0f + 1e-3f * static_cast<float>(c));
  const simd::F16 a = simd::splat(0.999999f), b = simd::splat(1e-7f);
  for (long long i = 0; i < steps; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = simd::fma(acc[c], a, b);
  }
  simd::F16 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = simd::add(total, acc[c]);
  simd::store(sink, total);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

const char* cpu_simd_isa() { return simd::isa(); }

double measure_fma_peak(ThreadPool& pool, double seconds) {
  std::vector<float> sink(static_cast<std::size_t>(pool.size()) * 16);
  // How many steps one thread does in `seconds`, then that much on every thread at once: the
  // whole pool's FLOPs over its wall time, however the tasks landed on the threads.
  long long steps = 1 << 12;
  while (true) {
    const auto started = Clock::now();
    fma_chains(steps, sink.data());
    const double t = seconds_since(started);
    if (t >= 0.02) {
      steps = static_cast<long long>(static_cast<double>(steps) * seconds / t);
      break;
    }
    steps *= 2;
  }
  const auto started = Clock::now();
  pool.parallel_for(pool.size(), [&](std::int64_t t) { fma_chains(steps, sink.data() + t * 16); });
  const double wall = seconds_since(started);
  return 2.0 * 16.0 * kChains * static_cast<double>(steps) * pool.size() / wall;
}

}  // namespace cpd
