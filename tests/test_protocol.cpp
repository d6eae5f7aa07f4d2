// The manifest is authoritative: a missing, duplicated, unexpected or mis-shaped message is
// an error naming the block and both ranks, never a silent merge.
#include <doctest/doctest.h>

#include <string>

#include "core/errors.h"
#include "engine/protocol.h"
#include "engine/tensor_layout.h"
#include "fault_transport.h"

using namespace cpd;
using cpd::testing::FaultInjectingTransport;

namespace {

std::string run_with(Protocol protocol, MessageKind kind,
                     const FaultInjectingTransport::Fault& fault) {
  Problem p;
  p.seq_len = 16;
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  InProcessTransport inner;
  FaultInjectingTransport transport(inner, kind, fault);
  const CaseGrid grid(p, CaseSpec{1, 2, 4, CpLayout::contiguous, protocol});
  try {
    run_protocol(grid, PathSpec{}, transport, inputs, {});
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

std::size_t find(const std::vector<Message>& m, int block, int dst) {
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m[i].header.block_index == block && m[i].header.dst == dst) return i;
  }
  FAIL("message not found");
  return 0;
}

std::string state_fault(const FaultInjectingTransport::Fault& fault) {
  return run_with(Protocol::ag_rs, MessageKind::partial_state, fault);
}

}  // namespace

TEST_CASE("untouched exchanges pass, for every protocol") {
  for (Protocol p : {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv}) {
    CHECK(run_with(p, MessageKind::partial_state, [](std::vector<Message>&) {}) == "");
  }
}

TEST_CASE("a missing state is an error naming the block and the ranks") {
  const std::string e =
      state_fault([](std::vector<Message>& m) { m.erase(m.begin() + find(m, 3, 1)); });
  CHECK(e.find("missing") != std::string::npos);
  CHECK(e.find("KV block 3 [12,16)") != std::string::npos);
  CHECK(e.find("from logical rank 1 to 1") != std::string::npos);
}

TEST_CASE("a duplicated state is an error") {
  const std::string e = state_fault([](std::vector<Message>& m) { m.push_back(m[find(m, 1, 1)]); });
  CHECK(e.find("duplicated") != std::string::npos);
  CHECK(e.find("KV block 1") != std::string::npos);
}

TEST_CASE("an unexpected state is an error") {
  // Block 3 lies wholly in the future of rank 0's tokens [0,8): nobody may send it there.
  const std::string e = state_fault([](std::vector<Message>& m) {
    Message extra = m[find(m, 3, 1)];
    extra.header.dst = 0;
    extra.header.token_begin = 0;
    extra.header.token_end = 8;
    m.push_back(extra);
  });
  CHECK(e.find("unexpected") != std::string::npos);
  CHECK(e.find("to 0") != std::string::npos);
}

TEST_CASE("mis-shaped states are errors: payload size, head range, sender, range") {
  CHECK(state_fault([](std::vector<Message>& m) {
          m[find(m, 2, 1)].payload.pop_back();
        }).find("mis-shaped") != std::string::npos);
  CHECK(state_fault([](std::vector<Message>& m) {
          m[find(m, 2, 1)].header.head_end -= 1;
        }).find("mis-shaped") != std::string::npos);
  CHECK(state_fault([](std::vector<Message>& m) {
          m[find(m, 2, 1)].header.src = 0;
        }).find("mis-shaped") != std::string::npos);
  CHECK(state_fault([](std::vector<Message>& m) {
          m[find(m, 2, 1)].header.block_end += 1;
        }).find("mis-shaped") != std::string::npos);
}

TEST_CASE("ring_kv and allgather_kv validate the K/V they receive") {
  for (Protocol p : {Protocol::ring_kv, Protocol::allgather_kv}) {
    CAPTURE(to_string(p));
    CHECK(run_with(p, MessageKind::kv_shard, [](std::vector<Message>& m) {
            m.pop_back();
          }).find("missing") != std::string::npos);
    CHECK(run_with(p, MessageKind::kv_shard, [](std::vector<Message>& m) {
            m.push_back(m.back());
          }).find("duplicated") != std::string::npos);
    CHECK(run_with(p, MessageKind::kv_shard, [](std::vector<Message>& m) {
            m.back().header.token_end -= 1;
          }).find("kv_shard") != std::string::npos);
  }
}

TEST_CASE("global tensors: shards that do not tile [0, S) per head are refused") {
  // World 8, process 7: it hosts none of the 2 ranks, so no shard is read, only the layout.
  Problem p;
  p.seq_len = 16;
  CaseGrid grid(p, CaseSpec{1, 2, 4, CpLayout::contiguous, Protocol::ag_rs});
  CHECK_NOTHROW(global_tensor(grid, 8, 7, 128, {}));
  grid.ranks[1].tokens.front().begin += 1;  // a gap at token 8
  CHECK_THROWS_WITH_AS(global_tensor(grid, 8, 7, 128, {}), doctest::Contains("do not tile"),
                       std::logic_error);
  grid.ranks[1].tokens.front().begin -= 2;  // an overlap
  CHECK_THROWS_WITH_AS(global_tensor(grid, 8, 7, 128, {}), doctest::Contains("do not tile"),
                       std::logic_error);
  grid.ranks[1].tokens.front().begin += 1;
  grid.ranks[1].tokens.front().end -= 1;  // short of S
  CHECK_THROWS_WITH_AS(global_tensor(grid, 8, 7, 128, {}), doctest::Contains("end at 15"),
                       std::logic_error);
}
