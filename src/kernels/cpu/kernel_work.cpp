#include "kernels/cpu/kernel_work.h"

#include <atomic>

namespace cpd {
namespace {

// One relaxed add per tile of up to 16 rows against a whole block: nothing a kernel notices.
std::atomic<std::uint64_t> forward_pairs{0}, backward_pairs{0};

}  // namespace

KernelWork kernel_work() {
  return KernelWork{forward_pairs.load(std::memory_order_relaxed),
                    backward_pairs.load(std::memory_order_relaxed)};
}

namespace kernel_work_counters {
void add_forward(std::uint64_t pairs) { forward_pairs.fetch_add(pairs, std::memory_order_relaxed); }
void add_backward(std::uint64_t pairs) {
  backward_pairs.fetch_add(pairs, std::memory_order_relaxed);
}
}  // namespace kernel_work_counters

}  // namespace cpd
