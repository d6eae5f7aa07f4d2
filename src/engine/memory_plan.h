// What a run holds in memory, predicted from its cases' schedules: per process and per phase of
// each case, the buffers alive at that phase's high-water, by name and size, as the CPU backend
// allocates them: the input memo's rows, the references, the paths' inputs and outputs, one
// round's states, rows and partials with their packed and received copies, the gradients and
// the kernels' per-thread scratch. `cpdrift plan` prints the largest; a test holds it to the
// resident peak that the report measures (summary.peak_rss_bytes_per_process).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/case_schedule.h"
#include "engine/manifest.h"
#include "engine/run_request.h"
#include "kernels/cpu/inputs.h"

namespace cpd {

/// Resident memory of a process that holds no tensor yet: the executable, its libraries, Open
/// MPI's and the thread pool's own pages, as measured on the CPU backend at a tiny S
/// (docs/performance.md); the plan adds it to every process.
inline constexpr std::uint64_t kProcessBaselineBytes = std::uint64_t{32} << 20;

/// Bytes of [batch][heads][rows][width] floats.
inline std::uint64_t tensor_bytes(std::int64_t batch, std::int64_t heads, std::int64_t rows,
                                  std::int64_t width) {
  return static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(heads) *
         static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(width) * sizeof(float);
}

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

/// What outlives a case on one process: the input memo's planes a process holds, (tensor,
/// batch, head) -- InputStore reserves a plane for the whole sequence the first time it generates
/// a row of it, from the heap, which keeps every page it ever touched (main.cpp) and hands them
/// out again, so a plane is counted whole; the CP=1 memos; the longest key ranges its kernel
/// threads have held (their scratch); the lm_head columns the input store keeps once a dlogp
/// leg has used them, (vocab, head); the layer's o_proj columns of each head group used.
struct ProcessMemos {
  std::set<std::tuple<int, int, std::int64_t>> planes;
  std::uint64_t cp1_memo = 0, cp1_backward_memo = 0;
  std::uint64_t scratch_keys = 0;  // the longest key range a kernel thread has held
  std::uint64_t forward_keys = 0;  // the longest key range of a forward kernel
  std::set<std::pair<int, std::int64_t>> lm_head;
  std::set<std::int64_t> o_proj_groups;  // the layer's o_proj columns the store keeps
  // The transposes the layer's backward reads (LayerWeights): o_proj's columns of a group (dO)
  // and q/k/v_proj's rows of a group (dX).
  std::set<std::int64_t> o_proj_transposed, qkv_transposed;
  std::set<std::pair<std::int64_t, std::int64_t>> layer_lm_head;  // its lm_head's row ranges

  void touch(TensorId tensor, int batch, const Range& heads);
};

/// One case's buffers on each process of a run, which the schedule's phases add phase by phase
/// (phase_memory.cpp): each phase says what it holds at its high-water and what it leaves in
/// the memos.
class CaseMemory {
 public:
  CaseMemory(const CaseGrid& grid, int threads, bool last_case, std::vector<ProcessMemos>& memos);

  const CaseGrid& grid() const { return grid_; }
  const Problem& problem() const { return grid_.problem; }
  /// The run's last case: the memos keep nothing new.
  bool last_case() const { return last_case_; }
  /// Each process's kernel threads.
  int threads() const { return threads_; }
  std::size_t processes() const { return memos_.size(); }
  const std::vector<const LogicalRank*>& hosted(std::size_t proc) const { return hosted_[proc]; }
  ProcessMemos& memos(std::size_t proc) { return memos_[proc]; }
  /// What the case holds across its phases on `proc`: the CP=1 references (out and lse of the
  /// hosted ranks' rows), and the forward paths' outputs kept for later phases.
  std::uint64_t& references(std::size_t proc) { return references_[proc]; }
  std::uint64_t& kept(std::size_t proc) { return kept_[proc]; }
  /// The widest round on `proc` of the forward's states, and of the backward's rows and partial
  /// dq (every process's computed at the first ask: a round is walked once).
  std::uint64_t forward_round_peak(std::size_t proc);
  std::uint64_t backward_round_peak(std::size_t proc);
  /// Phase `name` on `proc`: `terms`, with the memos, the kernels' scratch and the baseline.
  void add_phase(std::size_t proc, std::string name, const std::vector<MemoryTerm>& terms);
  /// Every process's phases, in the order they were added.
  std::vector<ProcessMemory> take() { return std::move(out_); }

 private:
  const CaseGrid& grid_;
  int threads_;
  bool last_case_;
  std::vector<ProcessMemos>& memos_;
  std::vector<std::vector<const LogicalRank*>> hosted_;
  std::vector<std::uint64_t> references_, kept_, forward_peaks_, backward_peaks_;
  std::vector<ProcessMemory> out_;
};

/// A run's memory, case after case: what outlives a case (the memos) carries into the next one.
class RunMemoryPlan {
 public:
  /// `processes`: the run's processes (logical rank l on process l mod processes); `threads`:
  /// each process's thread-pool size (the caller included).
  RunMemoryPlan(const Problem& problem, int processes, int threads);

  /// The next case of the run, its schedule's phases one by one; one entry per process.
  std::vector<ProcessMemory> add_case(const CaseSchedule& schedule, bool last_case);

 private:
  int threads_;
  std::vector<ProcessMemos> memos_;
};

/// The memory of each kind of phase (phase_memory.cpp), as the CPU backend allocates its buffers.
namespace phase_memory {
void reference_forward(CaseMemory& m);
void forward_path(CaseMemory& m, const ForwardPath& path);
void o_proj(CaseMemory& m);
void layer_backward(CaseMemory& m);
void dlogp(CaseMemory& m, int vocab);
void reference_backward(CaseMemory& m);
void backward(CaseMemory& m, bool lane_backward);
}  // namespace phase_memory

/// A floor under every process's peak that needs no grid (so it costs nothing at any S): the
/// baseline and the input memo's query planes of one rank's heads, for the run's largest case
/// with at least as many ranks as processes. 0 when no case is that large.
std::uint64_t process_memory_floor(const RunRequest& request, const RunPlan& plan, int processes);

/// Each process's planned peak over the run's CP cases, as `cpdrift plan` prints it (paged
/// cases are not modelled; `gpu`: a GPU run's forward paths).
std::vector<std::uint64_t> plan_run_peaks(const RunRequest& request, const RunPlan& plan,
                                          int processes, int threads, bool gpu);

}  // namespace cpd
