// One superstep's messages as bytes per peer process: what the GPU transports move through their
// staging buffers (NCCL, CUDA IPC), and the checks on what arrives. The MPI transport sends each
// payload from its own message instead (mpi_transport.cpp).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "comm/comm_context.h"
#include "comm/transport.h"

namespace cpd {

struct PackedSuperstep {
  std::vector<Message> local;                   // addressed to logical ranks of this process
  std::vector<std::vector<std::byte>> to_peer;  // [world]: header, payload, header, payload, …
};

/// Cuts `outgoing` by destination process (logical rank ℓ lives on process ℓ mod world) and
/// counts every message in `counters`.
PackedSuperstep pack_messages(std::vector<Message> outgoing, int world, int me,
                              TransportCounters& counters);

/// Appends the messages of one peer's buffer to `into`. Throws ProtocolError naming the peer
/// when the buffer is truncated or a header's payload overruns it.
void unpack_messages(std::span<const std::byte> buffer, int peer, std::vector<Message>& into);

/// The bookkeeping every transport between the processes of a CommContext shares: packing,
/// the exchange of byte counts, and unpacking what arrived. Subclasses move the bytes.
class PackedTransport : public Transport {
 public:
  explicit PackedTransport(const CommContext& comm) : comm_(comm) {}
  int world_size() const override { return comm_.size(); }
  int process_index() const override { return comm_.rank(); }
  std::string agree(const std::string& local_error) override { return comm_.agree(local_error); }

 protected:
  /// Packs `outgoing` (local messages kept aside) and exchanges byte counts: afterwards
  /// send_[p] holds the bytes for process p, send_sizes_[p] their count and recv_sizes_[p] the
  /// count process p sends here.
  void pack_and_size(std::vector<Message> outgoing);
  /// The local messages, then every peer's received buffer unpacked; clears the superstep.
  std::vector<Message> arrived(const std::vector<std::vector<std::byte>>& received);

  const CommContext& comm_;
  std::vector<Message> local_;
  std::vector<std::vector<std::byte>> send_;
  std::vector<std::uint64_t> send_sizes_, recv_sizes_;
};

}  // namespace cpd
