// The MPI transport: one superstep = an all-to-all of byte counts, then nonblocking sends and
// receives of one packed buffer per peer process, completed by finish().
#include <vector>

#include "comm_impl.h"
#include "cpdrift/comm/comm_context.h"
#include "cpdrift/comm/packed_messages.h"
#include "mpi_check.h"
#include "mpi_wait.h"

namespace cpd {
namespace {

constexpr int kDataTag = 7000;
constexpr std::size_t kMaxBytesPerMessage = std::size_t{1} << 30;  // MPI counts are int

class MpiTransport final : public PackedTransport {
 public:
  explicit MpiTransport(const CommContext& comm) : PackedTransport(comm) {}
  const char* name() const override { return "mpi"; }
  void start(std::vector<Message> outgoing) override;
  std::vector<Message> finish() override;

 private:
  void post(std::vector<std::byte>& buffer, int peer, bool send);

  std::vector<std::vector<std::byte>> recv_;
  std::vector<MPI_Request> requests_;
};

void MpiTransport::post(std::vector<std::byte>& buffer, int peer, bool send) {
  const MPI_Comm world = comm_.impl().world;
  for (std::size_t at = 0; at < buffer.size(); at += kMaxBytesPerMessage) {
    const int n = static_cast<int>(std::min(kMaxBytesPerMessage, buffer.size() - at));
    MPI_Request r;
    if (send) {
      CPD_MPI_CHECK(MPI_Isend(buffer.data() + at, n, MPI_BYTE, peer, kDataTag, world, &r));
    } else {
      CPD_MPI_CHECK(MPI_Irecv(buffer.data() + at, n, MPI_BYTE, peer, kDataTag, world, &r));
    }
    requests_.push_back(r);
  }
}

void MpiTransport::start(std::vector<Message> outgoing) {
  pack_and_size(std::move(outgoing));
  recv_.assign(send_.size(), {});
  for (std::size_t p = 0; p < send_.size(); ++p) {
    if (static_cast<int>(p) == comm_.rank()) continue;
    recv_[p].resize(recv_sizes_[p]);
    if (!recv_[p].empty()) post(recv_[p], static_cast<int>(p), false);
    if (!send_[p].empty()) post(send_[p], static_cast<int>(p), true);
  }
}

std::vector<Message> MpiTransport::finish() {
  if (!requests_.empty()) {
    wait_all(requests_);
    requests_.clear();
  }
  std::vector<Message> out = arrived(recv_);
  recv_.clear();
  return out;
}

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const CommContext& comm) {
  return std::make_unique<MpiTransport>(comm);
}

}  // namespace cpd
