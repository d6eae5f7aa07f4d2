// The MPI transport: one superstep = an all-to-all of how many messages each process sends each
// other, their headers as one block per peer, then every payload sent from and received into
// its own Message (no packed copy on either side), completed by finish().
#include <string>
#include <vector>

#include "comm/comm_context.h"
#include "comm/comm_impl.h"
#include "comm/mpi_check.h"
#include "comm/mpi_wait.h"

namespace cpd {
namespace {

constexpr int kDataTag = 7000;
constexpr std::size_t kMaxBytesPerMessage = std::size_t{1} << 30;  // MPI counts are int

// A message's header and the length of the payload that follows it, as sent: the receiver sizes
// its buffer by what is sent, never by what the header claims (the inboxes check that against
// the manifest), so a wrong header cannot leave a send unmatched.
struct WireHeader {
  MessageHeader header;
  std::uint64_t floats;
};

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(const CommContext& comm) : comm_(comm) {}
  const char* name() const override { return "mpi"; }
  int world_size() const override { return comm_.size(); }
  int process_index() const override { return comm_.rank(); }
  std::string agree(const std::string& local_error) override { return comm_.agree(local_error); }
  void start(std::vector<Message> outgoing) override;
  std::vector<Message> finish() override;

 private:
  // Posts a nonblocking send or receive of `bytes` at `data` with `peer`, in pieces MPI can
  // count; MPI matches the pieces in the order they are posted.
  void post(void* data, std::size_t bytes, int peer, bool send);

  const CommContext& comm_;
  std::vector<Message> local_;                  // to logical ranks of this process
  std::vector<std::vector<Message>> out_, in_;  // [peer process]
  std::vector<std::vector<WireHeader>> out_headers_, in_headers_;
  std::vector<MPI_Request> requests_;
};

void MpiTransport::post(void* data, std::size_t bytes, int peer, bool send) {
  const MPI_Comm world = comm_.impl().world;
  auto* base = static_cast<std::byte*>(data);
  for (std::size_t at = 0; at < bytes; at += kMaxBytesPerMessage) {
    const int n = static_cast<int>(std::min(kMaxBytesPerMessage, bytes - at));
    MPI_Request r;
    if (send) {
      CPD_MPI_CHECK(MPI_Isend(base + at, n, MPI_BYTE, peer, kDataTag, world, &r));
    } else {
      CPD_MPI_CHECK(MPI_Irecv(base + at, n, MPI_BYTE, peer, kDataTag, world, &r));
    }
    requests_.push_back(r);
  }
}

void MpiTransport::start(std::vector<Message> outgoing) {
  const int world = comm_.size(), me = comm_.rank();
  const std::size_t peers = static_cast<std::size_t>(world);
  out_ = route_messages(std::move(outgoing), world, me, counters_);
  local_ = std::move(out_[static_cast<std::size_t>(me)]);
  if (world == 1) return;
  in_.assign(peers, {});
  out_headers_.assign(peers, {});
  in_headers_.assign(peers, {});
  std::vector<std::uint64_t> counts(peers, 0), in_counts(peers, 0);
  for (std::size_t p = 0; p < peers; ++p) {
    counts[p] = out_[p].size();
    for (const Message& m : out_[p])
      out_headers_[p].push_back(WireHeader{m.header, m.payload.size()});
  }
  comm_.alltoall(counts, in_counts);

  // The headers first: each says how large a payload to receive.
  for (std::size_t p = 0; p < peers; ++p) {
    if (static_cast<int>(p) == me) continue;
    in_headers_[p].resize(in_counts[p]);
    post(in_headers_[p].data(), in_headers_[p].size() * sizeof(WireHeader), static_cast<int>(p),
         false);
    post(out_headers_[p].data(), out_headers_[p].size() * sizeof(WireHeader), static_cast<int>(p),
         true);
  }
  wait_all(requests_);
  requests_.clear();
  // Then every payload in header order, from and into the messages themselves.
  for (std::size_t p = 0; p < peers; ++p) {
    if (static_cast<int>(p) == me) continue;
    for (const WireHeader& w : in_headers_[p]) {
      in_[p].push_back(Message{w.header, unwritten_floats(w.floats)});  // received whole
      Message& m = in_[p].back();
      post(m.payload.data(), m.payload.size() * sizeof(float), static_cast<int>(p), false);
    }
    for (Message& m : out_[p])
      post(m.payload.data(), m.payload.size() * sizeof(float), static_cast<int>(p), true);
  }
}

std::vector<Message> MpiTransport::finish() {
  wait_all(requests_);
  requests_.clear();
  std::vector<Message> arrived = std::move(local_);
  local_.clear();
  out_.clear();
  out_headers_.clear();
  in_headers_.clear();
  for (std::vector<Message>& from : in_) {
    for (Message& m : from) arrived.push_back(std::move(m));
  }
  in_.clear();
  return arrived;
}

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const CommContext& comm) {
  return std::make_unique<MpiTransport>(comm);
}

}  // namespace cpd
