// Wall time this process spends per kind of work, for `cpdrift bench`'s breakdown of a whole
// case (the kernels against everything around them). Timed where the engine's main thread
// calls into each kind, never inside the thread pool; scopes of different kinds do not nest.
#pragma once

#include <array>
#include <chrono>

namespace cpd {

enum class WorkKind {
  kernels,     // the attention kernels: partial states, folds, backward block pairs
  merge,       // the ordered merges of partial states (the probe's included)
  checks,      // the FP64 merge oracle
  inputs,      // generating inputs
  projection,  // dlogp's per-head logits
  logprobs,    // dlogp's fold of the heads' logits, log-softmax and KL at the token owner
  messages,    // supersteps: packing, moving, unpacking and validating messages
  statistics,  // drift statistics of published comparisons
  digests,     // digests of published tensors (and the dump)
  count
};
inline constexpr std::array<const char*, static_cast<std::size_t>(WorkKind::count)> kWorkKindNames{
    "kernels",  "merge",    "checks",     "inputs", "projection",
    "logprobs", "messages", "statistics", "digests"};

/// Seconds spent per kind since the process started (or the last reset).
double work_seconds(WorkKind kind);
void reset_work_seconds();

/// Adds its lifetime to `kind`.
class WorkTimer {
 public:
  explicit WorkTimer(WorkKind kind) : kind_(kind), start_(std::chrono::steady_clock::now()) {}
  ~WorkTimer();
  WorkTimer(const WorkTimer&) = delete;
  WorkTimer& operator=(const WorkTimer&) = delete;

 private:
  WorkKind kind_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace cpd
