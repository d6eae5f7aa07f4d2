// The MPI transport: one superstep = an all-to-all of byte counts, then nonblocking sends and
// receives of one packed buffer per peer process, completed by finish().
#include <cstring>
#include <vector>

#include "comm_impl.h"
#include "cpdrift/comm/comm_context.h"
#include "cpdrift/core/errors.h"
#include "cpdrift/core/plan.h"
#include "mpi_check.h"

namespace cpd {
namespace {

constexpr int kDataTag = 7000;
constexpr std::size_t kMaxBytesPerMessage = std::size_t{1} << 30;  // MPI counts are int

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(const CommContext& comm) : comm_(comm) {}
  const char* name() const override { return "mpi"; }
  int world_size() const override { return comm_.size(); }
  int process_index() const override { return comm_.rank(); }
  void start(std::vector<Message> outgoing) override;
  std::vector<Message> finish() override;
  std::string agree(const std::string& local_error) override { return comm_.agree(local_error); }

 private:
  void post(std::vector<std::byte>& buffer, int peer, bool send);

  const CommContext& comm_;
  std::vector<Message> local_;
  std::vector<std::vector<std::byte>> send_, recv_;
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
  const int world = comm_.size(), me = comm_.rank();
  send_.assign(static_cast<std::size_t>(world), {});
  recv_.assign(static_cast<std::size_t>(world), {});
  local_.clear();
  for (Message& m : outgoing) {
    const std::size_t payload = m.payload.size() * sizeof(float);
    ++counters_.messages;
    counters_.bytes += sizeof(MessageHeader) + payload;
    const int peer = process_of(m.header.dst, world);
    if (peer == me) {
      local_.push_back(std::move(m));
      continue;
    }
    counters_.remote_bytes += sizeof(MessageHeader) + payload;
    std::vector<std::byte>& buf = send_[static_cast<std::size_t>(peer)];
    const std::size_t at = buf.size();
    buf.resize(at + sizeof(MessageHeader) + payload);
    std::memcpy(buf.data() + at, &m.header, sizeof(MessageHeader));
    std::memcpy(buf.data() + at + sizeof(MessageHeader), m.payload.data(), payload);
  }
  if (world == 1) return;
  std::vector<std::uint64_t> send_sizes(static_cast<std::size_t>(world)),
      recv_sizes(send_sizes.size());
  for (int p = 0; p < world; ++p)
    send_sizes[static_cast<std::size_t>(p)] = send_[static_cast<std::size_t>(p)].size();
  CPD_MPI_CHECK(MPI_Alltoall(send_sizes.data(), 1, MPI_UINT64_T, recv_sizes.data(), 1, MPI_UINT64_T,
                             comm_.impl().world));
  for (int p = 0; p < world; ++p) {
    const auto i = static_cast<std::size_t>(p);
    recv_[i].resize(recv_sizes[i]);
    if (!recv_[i].empty()) post(recv_[i], p, false);
    if (!send_[i].empty()) post(send_[i], p, true);
  }
}

std::vector<Message> MpiTransport::finish() {
  if (!requests_.empty()) {
    CPD_MPI_CHECK(
        MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
    requests_.clear();
  }
  std::vector<Message> arrived = std::move(local_);
  local_.clear();
  for (std::size_t p = 0; p < recv_.size(); ++p) {
    const std::vector<std::byte>& buf = recv_[p];
    std::size_t at = 0;
    while (at < buf.size()) {
      Message m;
      if (buf.size() - at < sizeof(MessageHeader)) {
        throw ProtocolError("truncated message header from process " + std::to_string(p));
      }
      std::memcpy(&m.header, buf.data() + at, sizeof(MessageHeader));
      at += sizeof(MessageHeader);
      const std::int64_t floats = m.header.floats;
      if (floats < 0 || static_cast<std::uint64_t>(floats) * sizeof(float) > buf.size() - at) {
        throw ProtocolError("malformed " + describe(m.header) + " from process " +
                            std::to_string(p) + ": payload of " + std::to_string(floats) +
                            " floats overruns the buffer");
      }
      m.payload.resize(static_cast<std::size_t>(floats));
      std::memcpy(m.payload.data(), buf.data() + at, m.payload.size() * sizeof(float));
      at += m.payload.size() * sizeof(float);
      arrived.push_back(std::move(m));
    }
  }
  send_.clear();
  recv_.clear();
  return arrived;
}

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const CommContext& comm) {
  return std::make_unique<MpiTransport>(comm);
}

}  // namespace cpd
