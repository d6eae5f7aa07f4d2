// The command line's entry (what main() calls once MPI is up), the subcommands it dispatches
// to, each returning the process's exit status, and the run's table.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "cli/options.h"
#include "comm/comm_context.h"
#include "core/util/process_memory.h"
#include "report/run_report.h"

namespace cpd {

/// Runs `argv` (the program's name first) on this process of `comm` and returns its exit
/// status: a usage error is one line from rank 0 and status 2 on every process; a failure on
/// one process alone is its own line and, in a job of several, MPI_Abort. Collective. Tests
/// call it in-process to run many invocations in one job.
int cli_main(const std::vector<std::string>& argv, const CommContext& comm);

/// `cpdrift [run]`: runs every case, writes the report (and dump), prints the table; returns
/// the report (its statistics on every process, its digests on rank 0; passed() alike on all).
RunReport execute_run(const RunOptions& options, const CommContext& comm,
                      const std::string& command_line);

/// `cpdrift accept`: the acceptance matrix, written as ws2_attention_gpu_acceptance/v1; 0 only
/// when every required row passed.
int accept_command(const AcceptOptions& options, const CommContext& comm,
                   const std::string& command_line);

/// Rank 0 makes sure `path` (a report; "" for none) can be written before any work, so a long
/// run never ends in an unwritable path: a UsageError on every process otherwise. Collective.
void check_output_path(const std::string& path, const CommContext& comm);

/// Refuses a process that would need `need` bytes (`when`: "at its peak (whose estimate)") and
/// may count on `budget`: "not enough memory: ..., `advice`", a UsageError.
[[noreturn]] void refuse_memory(int rank, std::uint64_t need, const std::string& when,
                                const MemoryBudget& budget, const std::string& advice);

/// `cpdrift plan`: per case and logical rank, the kernels' FLOPs and the bytes each phase moves
/// (exactly what a run counts), the estimated time on the profile's machine and the protocol it
/// would pick; nothing runs. Rank 0 prints; other processes only agree.
int plan_command(const PlanOptions& options, const CommContext& comm);

/// `cpdrift compare TRAIN ROLLOUT`: rank 0 reads both streams, aligns them and prints and
/// writes the figures; 2 for an invalid comparison, 1 when --max-abs-delta fails, every
/// process agreeing.
int compare_command(const CompareOptions& options, const CommContext& comm,
                    const std::string& command_line);

/// `cpdrift bench`: the kernels' throughput (CPU FP32 and BF16-emulated, or the GPU paths).
int bench_command(const BenchOptions& options, const CommContext& comm);

/// Rank 0's table of a run (design §6): a `#` header, one row per case as it completes, then
/// the sections after the case rows (the dlogp leg's RL metrics, the production lanes, the
/// paged cases, the trainer-vs-rollout pairs; each only when it ran), the legend, the failed
/// checks, wall time and peak memory, and `# Drift check : OK` or `FAILED`.
void print_header(std::FILE* out, const RunReport& report, std::size_t case_count,
                  std::size_t paged_count);
void print_case_row(std::FILE* out, const CaseResult& c);
void print_footer(std::FILE* out, const RunReport& report);
/// --scope layer: the stacks' sums over TP ranks in o_proj (numerics.md §12), per case, and the
/// trainer-vs-rollout pairs through them (cli/human_tp_lanes.cpp).
void print_tp_lane_rows(std::FILE* out, const RunReport& report);
void print_tp_lane_pairs(std::FILE* out, const RunReport& report);

}  // namespace cpd
