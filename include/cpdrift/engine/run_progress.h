// Progress of a long run, on rank 0's stderr: as each phase of a case ends, how far the run is
// by the plan's work (work_plan.h: the kernels' FLOPs of every phase, this tool's CP=1 checks
// included) and how long the rest should take at the pace so far.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "cpdrift/engine/manifest.h"
#include "cpdrift/engine/work_plan.h"

namespace cpd {

class RunProgress {
 public:
  /// `total_flops`: the run's planned work; `out`: where the lines go (nullptr: nowhere). A
  /// case's start is always said; a phase's end only `quiet_seconds` after the last line, so a
  /// matrix of small cases prints one line each and a long case a line per phase.
  RunProgress(double total_flops, std::size_t cases, std::FILE* out, double quiet_seconds = 2.0);

  /// Case `index` (from 0) begins.
  void start_case(std::size_t index, const std::string& name);
  /// One phase of the current case ended, `flops` of planned work done.
  void phase_done(const char* phase, double flops);

  /// Planned FLOPs of the phases run_case reports: one forward pass, the CP=1 reference
  /// forwards, the backward with its CP=1 reference (forward and backward); and of a whole case.
  static double forward_pass_flops(const Problem& p, const CaseWork& w);
  static double reference_flops(const Problem& p, const CaseWork& w);
  static double backward_flops(const Problem& p, const CaseWork& w);
  static double case_flops(const Problem& p, const CaseWork& w, std::size_t forward_paths);

 private:
  double total_, done_ = 0;
  std::size_t cases_, index_ = 0;
  std::string name_;
  std::FILE* out_;
  double quiet_seconds_;
  std::chrono::steady_clock::time_point started_, last_line_;
};

}  // namespace cpd
