// The manifest is authoritative: a missing, duplicated, unexpected or mis-shaped message is
// an error naming the block and both ranks, never a silent merge.
#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "cpdrift/core/errors.h"
#include "cpdrift/engine/protocol.h"

using namespace cpd;

namespace {

// Delivers in-process, but lets a test tamper with the partial states first.
class FaultyTransport final : public Transport {
 public:
  explicit FaultyTransport(std::function<void(std::vector<Message>&)> fault)
      : fault_(std::move(fault)) {}
  const char* name() const override { return "faulty"; }
  int world_size() const override { return 1; }
  int process_index() const override { return 0; }
  std::vector<Message> exchange(std::vector<Message> outgoing) override {
    const bool states =
        !outgoing.empty() && outgoing.front().header.kind == MessageKind::partial_state;
    if (states) fault_(outgoing);
    return outgoing;
  }

 private:
  std::function<void(std::vector<Message>&)> fault_;
};

std::string run_with(const std::function<void(std::vector<Message>&)>& fault) {
  Problem p;
  p.seq_len = 16;
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  FaultyTransport transport(fault);
  const CaseGrid grid(p, CaseSpec{1, 2, 4, CpLayout::contiguous, Protocol::ag_rs});
  try {
    run_protocol(grid, PathSpec{}, transport, inputs, false);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

// The last state rank 1 sends to itself: block 3 [12,16), tokens [8,16).
std::size_t find_state(const std::vector<Message>& m, int block, int dst) {
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m[i].header.block_index == block && m[i].header.dst == dst) return i;
  }
  FAIL("state not found");
  return 0;
}

}  // namespace

TEST_CASE("an untouched exchange passes") {
  CHECK(run_with([](std::vector<Message>&) {}) == "");
}

TEST_CASE("a missing state is an error naming the block and the ranks") {
  const std::string e =
      run_with([](std::vector<Message>& m) { m.erase(m.begin() + find_state(m, 3, 1)); });
  CHECK(e.find("missing") == 0);
  CHECK(e.find("KV block 3 [12,16)") != std::string::npos);
  CHECK(e.find("from logical rank 1 to 1") != std::string::npos);
}

TEST_CASE("a duplicated state is an error") {
  const std::string e =
      run_with([](std::vector<Message>& m) { m.push_back(m[find_state(m, 1, 1)]); });
  CHECK(e.find("duplicated") == 0);
  CHECK(e.find("KV block 1") != std::string::npos);
}

TEST_CASE("an unexpected state is an error") {
  // Block 3 lies wholly in the future of rank 0's tokens [0,8): nobody may send it there.
  const std::string e = run_with([](std::vector<Message>& m) {
    Message extra = m[find_state(m, 3, 1)];
    extra.header.dst = 0;
    extra.header.token_begin = 0;
    extra.header.token_end = 8;
    m.push_back(extra);
  });
  CHECK(e.find("unexpected") == 0);
  CHECK(e.find("to 0") != std::string::npos);
}

TEST_CASE("mis-shaped states are errors: payload size, head range, wrong sender") {
  CHECK(run_with([](std::vector<Message>& m) {
          m[find_state(m, 2, 1)].payload.pop_back();
        }).find("mis-shaped") == 0);
  CHECK(run_with([](std::vector<Message>& m) {
          m[find_state(m, 2, 1)].header.head_end -= 1;
        }).find("mis-shaped") == 0);
  CHECK(run_with([](std::vector<Message>& m) {
          m[find_state(m, 2, 1)].header.src = 0;
        }).find("mis-shaped") == 0);
  CHECK(run_with([](std::vector<Message>& m) {
          m[find_state(m, 2, 1)].header.block_end += 1;
        }).find("mis-shaped") == 0);
}
