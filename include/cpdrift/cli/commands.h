// The subcommands main() dispatches to. Each returns the process's exit status.
#pragma once

#include "cpdrift/cli/options.h"
#include "cpdrift/comm/comm_context.h"

namespace cpd {

/// Runs every case, writes the report, prints the table; 0 when every check passed, 1 else.
int run_command(const RunOptions& options, const CommContext& comm,
                const std::string& command_line);

/// Prints FP32-reference and BF16-emulated forward throughput.
int bench_command(const BenchOptions& options, const CommContext& comm);

/// Threads per process when not given: the cores of the node shared among its processes.
int default_threads(const CommContext& comm);

}  // namespace cpd
