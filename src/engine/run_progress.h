// Progress of a long run, on rank 0's stderr: as each phase of a case ends, how far the run is
// by its cases' schedules (the kernels' FLOPs of every phase, this tool's CP=1 checks included)
// and how long the rest should take at the pace so far.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace cpd {

class RunProgress {
 public:
  /// `cases`: every case's planned FLOPs (CaseSchedule::flops), in run order; `out`: where the
  /// lines go (nullptr: nowhere). A case's start is always said; a phase's end only `quiet_seconds`
  /// after the last line, so a matrix of small cases prints one line each and a long case a line
  /// per phase.
  RunProgress(std::vector<double> cases, std::FILE* out, double quiet_seconds = 2.0);

  /// Case `index` (from 0) begins.
  void start_case(std::size_t index, const std::string& name);
  /// A phase of the current case ended: `flops` of the run's planned work are done.
  void phase_done(const std::string& phase, double flops);

 private:
  std::vector<double> cases_;
  double total_ = 0, done_ = 0;
  std::size_t index_ = 0;
  std::string name_;
  std::FILE* out_;
  double quiet_seconds_;
  std::chrono::steady_clock::time_point started_, last_line_;
};

}  // namespace cpd
