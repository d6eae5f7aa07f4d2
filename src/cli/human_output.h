// Rank 0's human-readable output (design §6): a `#` header, one row per case, a verdict.
#pragma once

#include <cstdio>
#include <string>

#include "report/run_report.h"

namespace cpd {

void print_header(std::FILE* out, const RunReport& report, std::size_t case_count,
                  std::size_t paged_count);
void print_case_row(std::FILE* out, const CaseResult& c);
/// The failed checks, then `# Drift check : OK` or `FAILED`.
/// The paged cases' section: a header, then one row per case.
void print_paged_rows(std::FILE* out, const RunReport& report);
/// The dlogp leg's RL metrics, one row per case that ran it (nothing when none did).
void print_rl_rows(std::FILE* out, const RunReport& report);
/// The production lanes' block: per prefill case, each lane's drift and its bits vs canonical.
void print_lane_rows(std::FILE* out, const RunReport& report);
/// The trainer-vs-rollout block: one line per (prefill case, paged case) pair.
void print_pair_rows(std::FILE* out, const RunReport& report);
void print_footer(std::FILE* out, const RunReport& report);

}  // namespace cpd
