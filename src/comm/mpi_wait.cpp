#include "mpi_wait.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "mpi_check.h"

namespace cpd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::microseconds kSpin{50};
constexpr std::chrono::microseconds kFirstNap{10};
constexpr std::chrono::microseconds kLongestNap{200};

}  // namespace

void wait_all(std::span<MPI_Request> requests) {
  if (requests.empty()) return;
  const int n = static_cast<int>(requests.size());
  const Clock::time_point start = Clock::now();
  std::chrono::microseconds nap = kFirstNap;
  for (;;) {
    int done = 0;
    CPD_MPI_CHECK(MPI_Testall(n, requests.data(), &done, MPI_STATUSES_IGNORE));
    if (done != 0) return;
    if (Clock::now() - start < kSpin) continue;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, kLongestNap);
  }
}

void wait_one(MPI_Request& request) { wait_all(std::span<MPI_Request>(&request, 1)); }

}  // namespace cpd
