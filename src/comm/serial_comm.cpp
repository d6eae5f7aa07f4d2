// CommContext without MPI (-Dmpi=disabled): one process, every collective the identity. For
// machines without MPI (the device check's GPU machine); production builds use MPI.
#include <cstdio>
#include <cstdlib>

#include "comm/comm_context.h"
#include "core/errors.h"

namespace cpd {

struct CommContext::Impl {};

CommContext::CommContext(int*, char***) : impl_(std::make_unique<Impl>()) { set_error_rank(0); }

CommContext::~CommContext() = default;

std::string CommContext::library_version() const { return "none (built without MPI: one process)"; }
void CommContext::allreduce_sum(std::span<std::uint64_t>) const {}
void CommContext::allreduce_max(std::span<std::uint64_t>) const {}
bool CommContext::any(bool flag) const { return flag; }
void CommContext::barrier() const {}
void CommContext::stream_to_root(std::span<const StreamSegment> segments,
                                 const std::function<void(std::size_t, const float*)>& sink) const {
  for (std::size_t i = 0; i < segments.size(); ++i) sink(i, segments[i].data);
}
bool CommContext::same_everywhere(const std::string&) const { return true; }
std::string CommContext::broadcast(const std::string& text, int) const { return text; }
std::string CommContext::agree(const std::string& local_error) const { return local_error; }
std::vector<std::string> CommContext::allgather(const std::string& bytes) const { return {bytes}; }
void CommContext::alltoall(std::span<const std::uint64_t> send,
                           std::span<std::uint64_t> recv) const {
  recv[0] = send[0];
}

void CommContext::set_wait_timeout(double) const {}  // one process never waits for another

void CommContext::abort(int status) const {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}

std::unique_ptr<Transport> make_mpi_transport(const CommContext&) {
  return std::make_unique<InProcessTransport>();
}

}  // namespace cpd
