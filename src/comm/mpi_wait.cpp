#include "comm/mpi_wait.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "comm/mpi_check.h"

namespace cpd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::microseconds kSpin{50};
constexpr std::chrono::microseconds kFirstNap{10};
constexpr std::chrono::microseconds kLongestNap{200};

// What the processes other than rank 0 add to the timeout. Rank 0 may start its wait later
// than they do, and the job's teardown after its MPI_Abort takes time; on busy, oversubscribed
// cores a short grace let the others' lines follow rank 0's, so this one is generous.
constexpr double kOthersGrace = 10.0;

double g_timeout_seconds = 0.0;  // set_wait_timeout; 0: wait for ever
int g_rank = 0;

[[noreturn]] void timed_out() {
  std::fprintf(stderr,
               "cpdrift: error: rank %d: waited more than %g s for another process "
               "(--comm-timeout); ending the job\n",
               g_rank, g_timeout_seconds);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

}  // namespace

void set_wait_timeout(double seconds, int rank) {
  g_timeout_seconds = seconds;
  g_rank = rank;
}

void wait_all(std::span<MPI_Request> requests) {
  if (requests.empty()) return;
  const int n = static_cast<int>(requests.size());
  const Clock::time_point start = Clock::now();
  const double limit =
      g_timeout_seconds > 0 ? g_timeout_seconds + (g_rank == 0 ? 0.0 : kOthersGrace) : 0;
  std::chrono::microseconds nap = kFirstNap;
  for (;;) {
    int done = 0;
    CPD_MPI_CHECK(MPI_Testall(n, requests.data(), &done, MPI_STATUSES_IGNORE));
    if (done != 0) return;
    const Clock::duration waited = Clock::now() - start;
    if (waited < kSpin) continue;
    if (limit > 0 && std::chrono::duration<double>(waited).count() > limit) timed_out();
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, kLongestNap);
  }
}

void wait_one(MPI_Request& request) { wait_all(std::span<MPI_Request>(&request, 1)); }

}  // namespace cpd
