// `cpdrift plan`'s estimates of a case (plan_command.cpp) and how they are shown: the table and
// the JSON (plan_output.cpp).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "engine/case_schedule.h"
#include "engine/memory_plan.h"
#include "report/json.h"

namespace cpd {

/// A phase on the slowest process: its kernels and messages, in seconds.
struct PhaseEstimate {
  double compute = 0, comm = 0;  // of the slowest process
  double total() const { return compute + comm; }
};

/// A case's schedule with each phase's estimate and each process's memory.
struct CasePlan {
  CaseSchedule schedule;
  std::vector<PhaseEstimate> estimates{};  // per phase of the schedule
  double seconds = 0;
  std::vector<ProcessMemory> memory{};  // per process of the run

  const PhaseEstimate& estimate_of(const Phase* phase) const {
    return estimates[static_cast<std::size_t>(phase - schedule.phases.data())];
  }
  /// One forward pass: the first forward path's phase (every path moves the same).
  const Phase& forward() const { return *schedule.find(PhaseKind::forward); }
  const CaseSpec& spec() const { return schedule.grid.spec; }
};

/// The protocol with the lowest estimated forward, and one line saying why.
struct Pick {
  Protocol protocol;
  std::string why;
};

/// "1.23 s", "45.6 ms" or "789 us".
std::string duration(double s);

/// The case's block of the plan's table.
void print_case(std::FILE* out, const Problem& p, const CasePlan& c, const Pick& pick);

/// The case's entry in the plan's JSON.
json::Value case_json(const Problem& p, const CasePlan& c, const Pick& pick);

}  // namespace cpd
