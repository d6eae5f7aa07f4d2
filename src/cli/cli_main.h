// The command line, parsed, agreed on and dispatched: everything main() does once MPI is up.
// Tests call it in-process to run many invocations in one job.
#pragma once

#include <string>
#include <vector>

#include "comm/comm_context.h"

namespace cpd {

/// Runs `argv` (the program's name first) on this process of `comm` and returns its exit
/// status: a usage error is one line from rank 0 and status 2 on every process; a failure on
/// one process alone is its own line and, in a job of several, MPI_Abort. Collective.
int cli_main(const std::vector<std::string>& argv, const CommContext& comm);

}  // namespace cpd
