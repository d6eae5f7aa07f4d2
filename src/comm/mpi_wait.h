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

}  // namespace cpd
