// Completing MPI requests without holding a core.
#pragma once

#include <mpi.h>

#include <span>

namespace cpd {

/// Completes every request of `requests`. MPI progresses only inside its calls, so this polls;
/// it spins for a few tens of microseconds (a message about to land costs no latency), then
/// sleeps between polls, backing off to a fraction of a millisecond. A process waiting for a
/// slower peer leaves the core to the ranks still computing: with more processes than cores
/// (a workstation, CI) a spinning wait would take a share of the machine from them.
void wait_all(std::span<MPI_Request> requests);

/// wait_all over one request.
void wait_one(MPI_Request& request);

/// From now on a wait longer than `seconds` (0: none) ends the job: one line on stderr naming
/// this process (`rank`) and the timeout, then MPI_Abort with status 3. Processes other than
/// rank 0 allow themselves ten seconds more, so that when every process is left
/// waiting the line comes from rank 0 alone.
void set_wait_timeout(double seconds, int rank);

}  // namespace cpd
