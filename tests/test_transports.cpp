// What every transport between processes shares, tested without MPI or a GPU: the packed
// bytes of a superstep (and the checks on what arrives), and the GPU transports' host-side
// decisions — who shares a device, how many rounds a windowed exchange takes.
#include <doctest/doctest.h>

#include <cstring>

#include "comm/gpu_transports.h"
#include "comm/packed_messages.h"
#include "core/errors.h"

using namespace cpd;

namespace {

Message message(int src, int dst, int floats, float base) {
  Message m;
  m.header.kind = MessageKind::partial_state;
  m.header.src = src;
  m.header.dst = dst;
  m.header.floats = floats;
  for (int i = 0; i < floats; ++i) m.payload.push_back(base + static_cast<float>(i));
  return m;
}

}  // namespace

TEST_CASE("packed supersteps: cut by destination process, counted, and unpacked bit for bit") {
  // Logical rank ℓ lives on process ℓ mod 3; this is process 1.
  std::vector<Message> out{message(1, 0, 3, 1.0f), message(1, 4, 2, 7.0f), message(1, 3, 0, 0.0f),
                           message(4, 2, 5, -1.5f), message(1, 5, 1, 9.0f)};
  TransportCounters counters;
  const PackedSuperstep s = pack_messages(out, 3, 1, counters);
  REQUIRE(s.local.size() == 1);  // rank 4 → process 1
  CHECK(s.local[0].payload == FloatBuffer{7.0f, 8.0f});
  CHECK(counters.messages == 5);
  CHECK(counters.bytes == 5 * sizeof(MessageHeader) + 11 * sizeof(float));
  CHECK(counters.remote_bytes == 4 * sizeof(MessageHeader) + 9 * sizeof(float));
  std::vector<Message> arrived;
  for (int p = 0; p < 3; ++p) unpack_messages(s.to_peer[static_cast<std::size_t>(p)], p, arrived);
  REQUIRE(arrived.size() == 4);
  CHECK(arrived[0].header.dst == 0);  // process 0: ranks 0 and 3, in send order
  CHECK(arrived[1].header.dst == 3);
  CHECK(arrived[1].payload.empty());
  CHECK(arrived[2].payload == FloatBuffer{-1.5f, -0.5f, 0.5f, 1.5f, 2.5f});
  CHECK(arrived[3].payload == FloatBuffer{9.0f});
  CHECK(s.to_peer[1].empty());
}

TEST_CASE("unpacking refuses truncated and overrunning buffers, naming the peer") {
  TransportCounters counters;
  const PackedSuperstep s = pack_messages({message(0, 1, 4, 1.0f)}, 2, 0, counters);
  std::vector<std::byte> buf = s.to_peer[1];
  std::vector<Message> into;
  std::vector<std::byte> cut(buf.begin(),
                             buf.begin() + static_cast<std::ptrdiff_t>(sizeof(MessageHeader) / 2));
  CHECK_THROWS_WITH_AS(unpack_messages(cut, 1, into),
                       doctest::Contains("truncated message header from process 1"), ProtocolError);
  buf.resize(buf.size() - sizeof(float));  // the payload is one float short
  CHECK_THROWS_WITH_AS(unpack_messages(buf, 1, into), doctest::Contains("overruns the buffer"),
                       ProtocolError);
  MessageHeader h;
  std::memcpy(&h, buf.data(), sizeof h);
  h.floats = -1;
  std::memcpy(buf.data(), &h, sizeof h);
  CHECK_THROWS_AS(unpack_messages(buf, 1, into), ProtocolError);
}

TEST_CASE("GPU transport decisions: shared devices, exchange rounds, window slots") {
  CHECK(shared_device_error({"gpu-a", "gpu-b", "gpu-c"}).empty());
  CHECK(shared_device_error({"gpu-a", "gpu-b", "gpu-a", "gpu-b"}) ==
        "processes 0, 2 share one GPU, which NCCL refuses (one rank per GPU)");
  CHECK(exchange_rounds(std::vector<std::uint64_t>{0, 0}, 256) == 0);
  CHECK(exchange_rounds(std::vector<std::uint64_t>{1, 256}, 256) == 1);
  CHECK(exchange_rounds(std::vector<std::uint64_t>{257, 3}, 256) == 2);
  CHECK(exchange_rounds(std::vector<std::uint64_t>{std::uint64_t{5} << 30},
                        std::uint64_t{16} << 20) == 320);
  CHECK(window_slot_bytes(std::uint64_t{64} << 20, 4) == std::uint64_t{16} << 20);
  CHECK(window_slot_bytes(1000, 3) == 256);  // 333 rounded down to 256
  CHECK_THROWS_WITH_AS(window_slot_bytes(1000, 8), doctest::Contains("leaves no slot"), UsageError);
}
