#include "core/util/work_timers.h"

#include <atomic>

namespace cpd {
namespace {

// Nanoseconds per kind; atomics so a timer on any thread is safe, though the engine times only
// its main thread.
std::array<std::atomic<long long>, static_cast<std::size_t>(WorkKind::count)> nanoseconds{};

}  // namespace

double work_seconds(WorkKind kind) {
  return static_cast<double>(nanoseconds[static_cast<std::size_t>(kind)].load()) * 1e-9;
}

void reset_work_seconds() {
  for (auto& n : nanoseconds) n.store(0);
}

WorkTimer::~WorkTimer() {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now() - start_);
  nanoseconds[static_cast<std::size_t>(kind_)].fetch_add(ns.count(), std::memory_order_relaxed);
}

}  // namespace cpd
