// What a run holds in memory, predicted from its grids alone: per process and per phase of each
// case, the buffers alive at that phase's high-water, by name and size, as the CPU backend
// allocates them (engine/case_runner.cpp and the protocols, the backward and its CP=1
// reference): the input memo's rows, the references, the paths' inputs and outputs, one
// round's states, rows and partials with their packed and received copies, the gradients and
// the kernels' per-thread scratch. `cpdrift plan` prints the largest; a test holds it to the
// resident peak that the report measures (summary.peak_rss_bytes_per_process).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/manifest.h"
#include "engine/run_request.h"
#include "engine/work_plan.h"
#include "kernels/cpu/inputs.h"

namespace cpd {

/// Resident memory of a process that holds no tensor yet: the executable, its libraries, Open
/// MPI's and the thread pool's own pages. Measured on the CPU backend (a run at S=16 peaks at
/// 30-38 MB per process, of which about 2 MB are tensors); the plan adds it to every process.
inline constexpr std::uint64_t kProcessBaselineBytes = std::uint64_t{32} << 20;

struct MemoryTerm {
  std::string name;
  std::uint64_t bytes = 0;
};

/// The buffers one process holds at the high-water of one phase of a case.
struct PhaseMemory {
  std::string phase;
  std::vector<MemoryTerm> terms;
  std::uint64_t bytes() const;
};

struct ProcessMemory {
  std::vector<PhaseMemory> phases;  // in the order the case runs them
  /// The phase with the most bytes.
  const PhaseMemory& peak() const;
};

struct CaseMemoryOptions {
  std::vector<ForwardPath> paths;  // forward_paths' list for the run
  bool backward = false;
  int vocab = 0;               // 0: no dlogp
  bool last_case = true;       // memos keep nothing during the run's last case
  bool lane_backward = false;  // the backward's te_p2p lane (--include-lane-backward)
};

/// A run's memory, case after case: what outlives a case (the input memo's rows, the CP=1
/// memos) carries into the next one.
class RunMemoryPlan {
 public:
  /// `processes`: the run's processes (logical rank l on process l mod processes); `threads`:
  /// each process's thread-pool size (the caller included).
  RunMemoryPlan(const Problem& problem, int processes, int threads);

  /// The next case of the run; one entry per process.
  std::vector<ProcessMemory> add_case(const CaseGrid& grid, const CaseMemoryOptions& options);

 private:
  // The input memo's planes a process holds, (tensor, batch, head): InputStore reserves a
  // plane for the whole sequence the first time it generates a row of it, from the heap, which
  // keeps every page it ever touched (main.cpp) and hands them out again: a plane is counted
  // whole. (Counting only the rows generated underestimates the peaks at S = 4096 and 16384
  // by up to 15%: the heap's free pages are resident too.)
  struct Memo {
    std::set<std::tuple<int, int, std::int64_t>> planes;
    void touch(TensorId tensor, int batch, const Range& heads);
  };
  struct Process {
    Memo memo;
    std::uint64_t cp1_memo = 0, cp1_backward_memo = 0;  // bytes the CP=1 memos hold
    std::uint64_t scratch_keys = 0;  // the longest key range a kernel thread has held
    std::uint64_t forward_keys = 0;  // the longest key range of a forward kernel
    // The lm_head columns the input store keeps once a dlogp leg has used them: (vocab, head).
    std::set<std::pair<int, std::int64_t>> lm_head;
  };

  Problem problem_;
  int threads_;
  std::vector<Process> processes_;
};

/// A floor under every process's peak that needs no grid (so it costs nothing at any S): the
/// baseline and the input memo's query planes of one rank's heads, for the run's largest case
/// with at least as many ranks as processes. 0 when no case is that large.
std::uint64_t process_memory_floor(const RunRequest& request, const RunPlan& plan, int processes);

/// Each process's planned peak over the run's CP cases, as `cpdrift plan` prints it (paged
/// cases are not modelled; `gpu`: a GPU run's forward paths).
std::vector<std::uint64_t> plan_run_peaks(const RunRequest& request, const RunPlan& plan,
                                          int processes, int threads, bool gpu);

}  // namespace cpd
