// A prefill/chunked case as one list of phases, derived from its grid and the run's options:
// what each phase computes, the buffers it holds, the messages it sends and receives, its FLOPs.
// run_case executes the list; `cpdrift plan`'s bytes, FLOPs, time and memory, the memory check
// before a run and the progress line's share of the work are sums over the same list. A new
// phase is one more entry in schedule_case.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/manifest.h"
#include "engine/run_request.h"
#include "engine/work_plan.h"

namespace cpd {

struct CaseRun;    // a case being executed (case_run.h)
class CaseMemory;  // a case's buffers on each process of a run (memory_plan.h)

enum class PhaseKind {
  reference_forward,
  forward,
  o_proj,
  dlogp,
  reference_backward,
  backward,
  layer_backward
};
/// The rate its kernels run at on a device: FP32 or BF16 forward, or the FP32 backward.
enum class KernelRate { fp32, bf16, fp32_backward };

struct Phase {
  std::string name;
  PhaseKind kind;
  /// What its kernels evaluate and what it sends and receives, per logical rank: exactly what the
  /// kernels' and transports' counters count.
  PhaseWork work;
  /// FLOPs of one (row, key) pair of its kernels: 4·D forward, 10·D backward, 2·D a projection's
  /// dot, 0 for none.
  double flops_per_pair = 0;
  KernelRate rate = KernelRate::fp32;
  /// It runs on the host's CPU beside the case (this tool's CP=1 checks, a GPU run's FP32 re-run):
  /// a plan costs its time on the CPU profile only.
  bool host = false;
  /// Its buffers on each process at its high-water, and what it leaves in the memos.
  std::function<void(CaseMemory&)> memory;
  /// Runs it. Collective over the run's processes.
  std::function<void(CaseRun&)> run;

  double flops() const { return flops_per_pair * static_cast<double>(work.total_pairs()); }
};

/// What a run asks of each case beyond its grid.
struct ScheduleOptions {
  std::vector<ForwardPath> paths;  // forward_paths' list
  bool backward = false;           // --include-backward
  bool lane_backward = false;      // --include-lane-backward
  int vocab = 0;                   // > 0: dlogp over this vocabulary
};

struct CaseSchedule {
  CaseGrid grid;
  std::vector<Phase> phases;

  double flops() const;
  /// What the case's messages total, as the report's bytes_moved counts them.
  Traffic traffic() const;
  /// The first phase of `kind`; nullptr when the case has none.
  const Phase* find(PhaseKind kind) const;
};

/// What `request` asks of each case; `gpu`: a GPU run's forward paths.
ScheduleOptions schedule_options(const RunRequest& request, bool gpu);

/// The phases in the order they run: the CP=1 reference forward, each forward path, the layer's
/// o_proj (--scope layer), dlogp, the CP=1 reference backward, the backward and the layer's.
CaseSchedule schedule_case(const CaseGrid& grid, const ScheduleOptions& options);

/// The phases' names.
inline constexpr const char* kReferenceForwardPhase = "CP=1 reference forward";
inline constexpr const char* kOProjPhase = "layer: o_proj";
inline constexpr const char* kDlogpPhase = "dlogp";
inline constexpr const char* kReferenceBackwardPhase = "backward: CP=1 reference";
inline constexpr const char* kBackwardPhase = "backward";
inline constexpr const char* kLayerBackwardPhase = "layer: backward";
/// A forward path's phase, "forward: " and the path's name.
inline constexpr const char* kForwardPhasePrefix = "forward: ";

}  // namespace cpd
