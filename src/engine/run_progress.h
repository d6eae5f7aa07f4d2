// Progress of a long run, on rank 0's stderr: as each phase of a case ends, how far the run is
// by the plan's work (work_plan.h: the kernels' FLOPs of every phase, this tool's CP=1 checks
// included) and how long the rest should take at the pace so far.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/work_plan.h"

namespace cpd {

/// A case's planned FLOPs by the phases run_case reports.
struct CaseFlops {
  double forward_pass = 0;  // one forward path's exchange
  double reference = 0;     // the CP=1 reference (and counterpart) forwards, with the first path
  double backward = 0;      // the backward with its CP=1 reference (forward and backward)
  std::size_t forward_paths = 0;

  CaseFlops(const Problem& p, const CaseWork& w, std::size_t paths);
  double total() const {
    return static_cast<double>(forward_paths) * forward_pass + reference + backward;
  }
};

class RunProgress {
 public:
  /// `cases`: every case's planned work, in run order; `out`: where the lines go (nullptr:
  /// nowhere). A case's start is always said; a phase's end only `quiet_seconds` after the last
  /// line, so a matrix of small cases prints one line each and a long case a line per phase.
  RunProgress(std::vector<CaseFlops> cases, std::FILE* out, double quiet_seconds = 2.0);

  /// Case `index` (from 0) begins.
  void start_case(std::size_t index, const std::string& name);
  /// A forward path of the current case ended (the first carries the CP=1 reference forwards).
  void path_done(const char* path, bool first);
  /// The current case's backward ended.
  void backward_done();

 private:
  void done(const std::string& phase, double flops);

  std::vector<CaseFlops> cases_;
  double total_ = 0, done_ = 0;
  std::size_t index_ = 0;
  std::string name_;
  std::FILE* out_;
  double quiet_seconds_;
  std::chrono::steady_clock::time_point started_, last_line_;
};

}  // namespace cpd
