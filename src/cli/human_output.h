// Rank 0's human-readable output (design §6): a `#` header, one row per case, a verdict.
#pragma once

#include <cstdio>
#include <string>

#include "report/run_report.h"

namespace cpd {

void print_header(std::FILE* out, const RunReport& report, std::size_t case_count,
                  std::size_t paged_count);
void print_case_row(std::FILE* out, const CaseResult& c);
/// The sections after the case rows (the dlogp leg's RL metrics, the production lanes, the
/// paged cases, the trainer-vs-rollout pairs; each only when it ran), the legend, the failed
/// checks, wall time and peak memory, then `# Drift check : OK` or `FAILED`.
void print_footer(std::FILE* out, const RunReport& report);

}  // namespace cpd
