// Under mpirun (2 and 4 processes): a bad message — missing, duplicated, mis-shaped,
// unexpected — on one process fails every rank with the same error naming it, never a hang and
// never a silent merge; for the forward's states and K/V shards and for the backward's and
// dlogp's messages.
#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "case_digests.h"
#include "core/errors.h"
#include "engine/backward.h"
#include "engine/case_runner.h"
#include "engine/dlogp.h"
#include "fault_transport.h"
#include "mpi_support.h"

using namespace cpd;
using cpd::testing::comm;
using cpd::testing::kFp32;
using cpd::testing::small_problem;

namespace {

// Whether `error` says one of the '|'-separated alternatives of `expect`, followed by `what`.
bool says(const std::string& error, const std::string& expect, const std::string& what = "") {
  for (std::size_t from = 0;;) {
    const std::size_t bar = expect.find('|', from);
    if (error.find(expect.substr(from, bar - from) + what) != std::string::npos) return true;
    if (bar == std::string::npos) return false;
    from = bar + 1;
  }
}

}  // namespace

TEST_CASE("a bad message on one process fails every rank with the same error, without a hang") {
  const Problem p = small_problem();
  const std::unique_ptr<Transport> mpi = make_mpi_transport(comm());
  struct Fault {
    Protocol protocol;
    MessageKind kind;
    const char* expect;
    std::function<void(std::vector<Message>&)> tamper;
  };
  const std::vector<Fault> faults = {
      {Protocol::ag_rs, MessageKind::partial_state, "missing",
       [](std::vector<Message>& m) { m.pop_back(); }},
      {Protocol::ag_rs, MessageKind::partial_state, "duplicated",
       [](std::vector<Message>& m) { m.push_back(m.back()); }},
      // A short payload between processes is caught as a malformed buffer, within one as a
      // mis-shaped message: either way it names the message.
      {Protocol::ring_kv, MessageKind::kv_shard, "-shaped|malformed",
       [](std::vector<Message>& m) { m.back().payload.resize(m.back().payload.size() / 2); }},
      {Protocol::allgather_kv, MessageKind::kv_shard, "unexpected",
       [](std::vector<Message>& m) { m.back().header.token_begin += 1; }},
  };
  for (const Fault& f : faults) {
    CAPTURE(std::string(f.expect));
    // Only the last process tampers; everybody must hear about it.
    const bool tamper_here = comm().rank() == comm().size() - 1;
    testing::FaultInjectingTransport transport(*mpi, f.kind, [&](std::vector<Message>& m) {
      if (tamper_here && !m.empty()) f.tamper(m);
    });
    ThreadPool pool(1);
    InputStore inputs(p, pool);
    const CaseGrid grid(p, CaseSpec{2, 4, 8, CpLayout::contiguous, f.protocol});
    std::string error;
    try {
      run_protocol(grid, kFp32, transport, inputs, {});
    } catch (const ProtocolError& e) {
      error = e.what();
    }
    CAPTURE(error);
    CHECK(says(error, f.expect));
    CHECK(error.find("logical rank") != std::string::npos);
    CHECK(comm().same_everywhere(error));
  }
}

TEST_CASE("a bad backward or dlogp message fails every rank with an error naming it, no hang") {
  const Problem p = small_problem();
  const std::unique_ptr<Transport> mpi = make_mpi_transport(comm());
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  const CaseGrid grid(p, CaseSpec{2, 4, 8, CpLayout::contiguous, Protocol::ag_rs});
  const std::vector<RankOutput> forward = run_protocol(grid, kFp32, *mpi, inputs, {});
  std::vector<const AttnShard*> hidden;
  for (const RankOutput& o : forward) hidden.push_back(&o.merged);
  // A fault damages message i and returns the header the error must then name.
  using Messages = std::vector<Message>;
  struct Fault {
    const char* expect;
    std::function<MessageHeader(Messages&, std::size_t)> tamper;
  };
  const std::vector<Fault> faults = {
      {"missing",
       [](Messages& m, std::size_t i) {
         const MessageHeader h = m[i].header;
         m.erase(m.begin() + static_cast<std::ptrdiff_t>(i));
         return h;
       }},
      {"duplicated",
       [](Messages& m, std::size_t i) {
         m.push_back(m[i]);
         return m[i].header;
       }},
      {"mis-shaped|malformed",
       [](Messages& m, std::size_t i) {
         m[i].payload.resize(m[i].payload.size() / 2);
         return m[i].header;
       }},
      {"mis-shaped",
       [](Messages& m, std::size_t i) {
         m[i].header.head_end += 1;
         return m[i].header;
       }},
      {"unexpected",
       [](Messages& m, std::size_t i) {
         m[i].header.token_begin += 1;
         return m[i].header;
       }},
  };
  const int world = comm().size(), me = comm().rank();
  for (const MessageKind kind :
       {MessageKind::backward_rows, MessageKind::dq_partial, MessageKind::logit_partial}) {
    for (const Fault& f : faults) {
      CAPTURE(std::string(to_string(kind)));
      CAPTURE(std::string(f.expect));
      // Only the last process tampers, with its last message bound for another process (so a
      // short payload ends its buffer) or else its last message; everybody must hear about it.
      std::string named, at;  // the damaged message, and "process P: " of its destination
      testing::FaultInjectingTransport transport(*mpi, kind, [&](Messages& m) {
        if (me != world - 1 || m.empty()) return;
        std::size_t i = m.size() - 1;
        for (std::size_t j = 0; j < m.size(); ++j) {
          if (process_of(m[j].header.dst, world) != me) i = j;
        }
        const MessageHeader h = f.tamper(m, i);
        named = describe(h);
        at = "process " + std::to_string(process_of(h.dst, world)) + ": ";
      });
      std::string error;
      try {
        if (kind == MessageKind::logit_partial) {
          run_dlogp(grid, hidden, hidden, 17, transport, inputs);
        } else {
          run_backward(grid, forward, transport, inputs);
        }
      } catch (const ProtocolError& e) {
        error = e.what();
      }
      named = comm().broadcast(named, world - 1);
      at = comm().broadcast(at, world - 1);
      CAPTURE(error);
      CAPTURE(named);
      CHECK(named.rfind(to_string(kind), 0) == 0);
      CHECK(error.rfind(at, 0) == 0);
      CHECK(says(error, f.expect, " " + named));
      CHECK(comm().same_everywhere(error));
    }
  }
}
