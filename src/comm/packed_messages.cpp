#include "comm/packed_messages.h"

#include <cstring>
#include <string>

#include "core/errors.h"

namespace cpd {

PackedSuperstep pack_messages(std::vector<Message> outgoing, int world, int me,
                              TransportCounters& counters) {
  std::vector<std::vector<Message>> routed =
      route_messages(std::move(outgoing), world, me, counters);
  PackedSuperstep s;
  s.local = std::move(routed[static_cast<std::size_t>(me)]);
  s.to_peer.assign(routed.size(), {});
  for (std::size_t p = 0; p < routed.size(); ++p) {
    // Each peer's buffer sized once (no regrowth copies), and each payload freed as soon as its
    // bytes are in it: a superstep holds its remote payloads once, not twice.
    std::vector<std::byte>& buf = s.to_peer[p];
    std::size_t bytes = 0;
    for (const Message& m : routed[p])
      bytes += sizeof(MessageHeader) + m.payload.size() * sizeof(float);
    buf.reserve(bytes);
    for (Message& m : routed[p]) {
      const std::size_t at = buf.size(), payload = m.payload.size() * sizeof(float);
      buf.resize(at + sizeof(MessageHeader) + payload);
      std::memcpy(buf.data() + at, &m.header, sizeof(MessageHeader));
      // An empty payload's data() may be null, which memcpy may not be given even for 0 bytes.
      if (payload > 0)
        std::memcpy(buf.data() + at + sizeof(MessageHeader), m.payload.data(), payload);
      FloatBuffer().swap(m.payload);
    }
  }
  return s;
}

void unpack_messages(std::span<const std::byte> buf, int peer, std::vector<Message>& into) {
  std::size_t at = 0;
  while (at < buf.size()) {
    Message m;
    if (buf.size() - at < sizeof(MessageHeader)) {
      throw ProtocolError("truncated message header from process " + std::to_string(peer));
    }
    std::memcpy(&m.header, buf.data() + at, sizeof(MessageHeader));
    at += sizeof(MessageHeader);
    const std::int64_t floats = m.header.floats;
    if (floats < 0 || static_cast<std::uint64_t>(floats) * sizeof(float) > buf.size() - at) {
      throw ProtocolError("malformed " + describe(m.header) + " from process " +
                          std::to_string(peer) + ": payload of " + std::to_string(floats) +
                          " floats overruns the buffer");
    }
    m.payload.resize(static_cast<std::size_t>(floats));
    if (floats > 0)
      std::memcpy(m.payload.data(), buf.data() + at, m.payload.size() * sizeof(float));
    at += m.payload.size() * sizeof(float);
    into.push_back(std::move(m));
  }
}

void PackedTransport::pack_and_size(std::vector<Message> outgoing) {
  const int world = comm_.size();
  PackedSuperstep packed = pack_messages(std::move(outgoing), world, comm_.rank(), counters_);
  local_ = std::move(packed.local);
  send_ = std::move(packed.to_peer);
  send_sizes_.assign(static_cast<std::size_t>(world), 0);
  recv_sizes_.assign(send_sizes_.size(), 0);
  for (std::size_t p = 0; p < send_.size(); ++p) send_sizes_[p] = send_[p].size();
  if (world > 1) comm_.alltoall(send_sizes_, recv_sizes_);
}

std::vector<Message> PackedTransport::arrived(const std::vector<std::vector<std::byte>>& received) {
  std::vector<Message> out = std::move(local_);
  local_.clear();
  for (std::size_t p = 0; p < received.size(); ++p)
    unpack_messages(received[p], static_cast<int>(p), out);
  send_.clear();
  return out;
}

}  // namespace cpd
