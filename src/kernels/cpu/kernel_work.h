// What the CPU kernels evaluated, counted where they run: (batch, query head, query row, key)
// pairs under the causal mask, forward and backward. `cpdrift plan` predicts these counts
// exactly; the tests compare the two. A pair costs 4·D FLOPs forward (Q·Kᵀ and P·V) and 10·D
// backward (Q·Kᵀ again, dO·Vᵀ, Pᵀ·dO, dS·K and dSᵀ·Q).
#pragma once

#include <cstdint>

namespace cpd {

struct KernelWork {
  std::uint64_t forward_pairs = 0;
  std::uint64_t backward_pairs = 0;
};

/// This process's totals since it started (every thread's, every backend call's).
KernelWork kernel_work();

namespace kernel_work_counters {
/// Called once per tile by the kernels.
void add_forward(std::uint64_t pairs);
void add_backward(std::uint64_t pairs);
}  // namespace kernel_work_counters

}  // namespace cpd
