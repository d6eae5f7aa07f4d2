// `cpdrift plan`'s predictions against what runs: the bytes every pair of logical ranks
// exchanges (counted by a transport that tallies each delivered message) and the (row, key)
// pairs the kernels evaluate (their own counters), exactly, for every protocol, layout, split and
// round size, forward, backward, dlogp and the layer's o_proj; the closed-form pair count against a
// loop.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "case_digests.h"
#include "engine/backward.h"
#include "engine/case_run.h"
#include "engine/case_runner.h"
#include "engine/dlogp.h"
#include "engine/layer_backward.h"
#include "engine/layer_logprobs.h"
#include "engine/local_run.h"
#include "engine/memory_plan.h"
#include "engine/o_proj.h"
#include "engine/run_progress.h"
#include "engine/work_plan.h"
#include "kernels/cpu/kernel_work.h"
#include "recorded_run.h"

using namespace cpd;
using testing::kFp32;

namespace {

// Delivers through an InProcessTransport and tallies bytes per (src, dst) as the transports
// count them.
class TallyingTransport final : public Transport {
 public:
  explicit TallyingTransport(int ranks)
      : ranks_(ranks), bytes_(static_cast<std::size_t>(ranks) * ranks, 0) {}
  const char* name() const override { return inner_.name(); }
  int world_size() const override { return 1; }
  int process_index() const override { return 0; }
  void start(std::vector<Message> outgoing) override {
    for (const Message& m : outgoing) {
      bytes_[static_cast<std::size_t>(m.header.src * ranks_ + m.header.dst)] +=
          sizeof(MessageHeader) + m.payload.size() * sizeof(float);
    }
    inner_.start(std::move(outgoing));
    counters_ = inner_.counters();
  }
  std::vector<Message> finish() override { return inner_.finish(); }
  std::string agree(const std::string& e) override { return e; }
  /// The tally since the last take, cleared.
  std::vector<std::uint64_t> take() {
    std::vector<std::uint64_t> t(bytes_.size(), 0);
    std::swap(t, bytes_);
    return t;
  }

 private:
  int ranks_;
  std::vector<std::uint64_t> bytes_;
  InProcessTransport inner_;
};

std::uint64_t loop_pairs(const Range& rows, const Range& keys) {
  std::uint64_t n = 0;
  for (std::int64_t p = rows.begin; p < rows.end; ++p) {
    for (std::int64_t k = keys.begin; k < keys.end; ++k) n += k <= p ? 1 : 0;
  }
  return n;
}

}  // namespace

TEST_CASE("causal pairs: the closed form equals the loop") {
  for (std::int64_t a = 0; a < 12; ++a) {
    for (std::int64_t b = a; b < 14; ++b) {
      for (std::int64_t c = 0; c < 12; ++c) {
        for (std::int64_t d = c; d < 14; ++d) {
          CHECK(causal_pairs(Range{a, b}, Range{c, d}) == loop_pairs(Range{a, b}, Range{c, d}));
        }
      }
    }
  }
}

TEST_CASE("plan: bytes between ranks and kernel pairs are exactly what runs") {
  Problem p = testing::small_problem();
  p.seq_len = 48;
  const int vocab = 17;
  int checked = 0;
  for (const Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv}) {
    for (const CpLayout layout : {CpLayout::contiguous, CpLayout::zigzag}) {
      for (const int tp : {1, 2}) {
        for (const int cp : {1, 2, 3}) {
          for (const std::optional<std::int64_t> split : {std::optional<std::int64_t>{}, {5}}) {
            for (const std::int64_t round_rows : {0, 3}) {
              const CaseSpec spec{tp, cp, split, layout, protocol};
              if (!validate_case(spec, p).empty()) continue;
              const CaseGrid grid(p, spec, round_rows);
              CAPTURE(case_name(spec, p));
              CAPTURE(round_rows);
              const PhaseWork forward = forward_work(grid), backward = backward_work(grid),
                              dlogp = dlogp_work(grid, vocab);
              ThreadPool pool(2);
              InputStore inputs(p, pool);
              TallyingTransport transport(spec.num_logical_ranks());

              const KernelWork k0 = kernel_work();
              const std::vector<RankOutput> fwd = run_protocol(grid, kFp32, transport, inputs, {});
              const KernelWork k1 = kernel_work();
              CHECK(transport.take() == forward.bytes_between);
              CHECK(k1.forward_pairs - k0.forward_pairs == forward.total_pairs());

              run_backward(grid, fwd, transport, inputs);
              const KernelWork k2 = kernel_work();
              CHECK(transport.take() == backward.bytes_between);
              CHECK(k2.backward_pairs - k1.backward_pairs == backward.total_pairs());
              CHECK(k2.forward_pairs == k1.forward_pairs);

              std::vector<const AttnShard*> outs;
              for (const RankOutput& o : fwd) outs.push_back(&o.merged);
              run_dlogp(grid, outs, outs, vocab, transport, inputs);
              CHECK(transport.take() == dlogp.bytes_between);
              ++checked;
            }
          }
        }
      }
    }
  }
  CHECK(checked >= 40);
}

TEST_CASE(
    "plan: the layer's o_proj, dlogp and backward move exactly the bytes their schedule says") {
  // The tests' small layer: every piece of the layer's traffic at a fraction of Qwen3-8B's
  // weights (whose gradients each case would make).
  Problem p = testing::small_layer();
  p.seq_len = 48;
  ThreadPool pool(2);
  InputStore inputs(p, pool);  // the weights made once for every case
  int checked = 0;
  for (const CpLayout layout : {CpLayout::contiguous, CpLayout::zigzag}) {
    for (const int tp : {1, 2, 4}) {
      for (const int cp : {1, 2}) {
        const CaseSpec spec{tp, cp, 8, layout, Protocol::ag_rs};
        const CaseGrid grid(inputs.problem(), spec);
        CAPTURE(case_name(spec, p));
        TallyingTransport transport(spec.num_logical_ranks());
        const std::vector<RankOutput> fwd = run_protocol(grid, kFp32, transport, inputs, {});
        transport.take();
        std::vector<const AttnShard*> outs;
        for (const RankOutput& o : fwd) outs.push_back(&o.merged);
        const std::vector<LayerOutputs> layer = run_o_proj(grid, outs, outs, transport, inputs);
        const std::vector<std::uint64_t> moved = transport.take();
        CHECK(moved == o_proj_work(grid).bytes_between);
        run_layer_dlogp(grid, layer, 300, transport, inputs);
        CHECK(transport.take() == dlogp_work(grid, 300).bytes_between);
        // The backward's gradients, twice (the layer makes its planes over in place), through the
        // layer's backward: its token chains and the dX chain.
        std::vector<RankGradients> grads = run_backward(grid, fwd, transport, inputs);
        CHECK(transport.take() == backward_work(grid).bytes_between);
        std::vector<RankGradients> again = grads;
        std::vector<LayerBackwardInputs> layer_in;
        for (std::size_t i = 0; i < grads.size(); ++i) {
          layer_in.push_back(LayerBackwardInputs{{&grads[i].dq, &again[i].dq},
                                                 {&grads[i].dk, &again[i].dk},
                                                 {&grads[i].dv, &again[i].dv},
                                                 {&fwd[i].merged.out, &fwd[i].merged.out}});
        }
        const LocalCollectives collectives;
        run_layer_backward(grid, layer_in, transport, collectives, inputs);
        CHECK(transport.take() == layer_backward_work(grid).bytes_between);
        // The chain moves planes exactly when there are TP ranks to pass them between.
        const bool any = std::any_of(moved.begin(), moved.end(), [](auto b) { return b > 0; });
        CHECK(any == (tp > 1));
        ++checked;
      }
    }
  }
  CHECK(checked == 12);
}

TEST_CASE("plan: a prediction for other rounds does not match (negative control)") {
  const Problem p = testing::small_problem();
  const CaseSpec spec{1, 2, 4, CpLayout::contiguous, Protocol::ag_rs};
  const CaseGrid grid(p, spec), other(p, spec, 3);
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  TallyingTransport transport(2);
  run_protocol(grid, kFp32, transport, inputs, {});
  const std::vector<std::uint64_t> ran = transport.take();
  CHECK(ran == forward_work(grid).bytes_between);
  // Rounds of 3 rows send more state messages (more headers) for the same payload.
  CHECK(ran != forward_work(other).bytes_between);
}

TEST_CASE("schedule: a whole case's kernel pairs and bytes are its phases' sums") {
  Problem p = testing::small_problem();
  p.seq_len = 32;
  for (const Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv}) {
    for (const std::optional<std::int64_t> split : {std::optional<std::int64_t>{}, {4}}) {
      for (const auto& [tp, cp] : {std::pair{1, 1}, {2, 2}, {1, 4}}) {
        const CaseSpec spec{tp, cp, split, CpLayout::zigzag, protocol};
        CAPTURE(case_name(spec, p));
        ThreadPool pool(2);
        LocalRun local(p, pool, true, 17);
        const RunContext& ctx = local.ctx;

        const CaseSchedule s = schedule_case(CaseGrid(p, spec), schedule_options(ctx));
        std::uint64_t forward = 0, backward = 0;
        for (const Phase& phase : s.phases) {
          const bool bwd =
              phase.kind == PhaseKind::backward || phase.kind == PhaseKind::reference_backward;
          (bwd ? backward : forward) += phase.work.total_pairs();
        }
        const KernelWork k0 = kernel_work();
        const CaseResult c = testing::recorded_case(ctx, spec);
        const KernelWork k1 = kernel_work();
        // The CP=1 reference backward starts from the reference forward: no forward of its own.
        CHECK(k1.forward_pairs - k0.forward_pairs == forward);
        CHECK(k1.backward_pairs - k0.backward_pairs == backward);
        CHECK(c.executed.moved.bytes == s.traffic().bytes);
        CHECK(c.executed.moved.messages == s.traffic().messages);
      }
    }
  }
}

TEST_CASE("progress: the share of the planned work and the time left, phase by phase") {
  char buf[4096] = {};
  std::FILE* out = fmemopen(buf, sizeof buf, "w");
  REQUIRE(out != nullptr);
  {
    RunProgress progress({100, 300}, out, 0.0);
    progress.start_case(0, "first");
    progress.phase_done("forward: fp32", 100);
    progress.start_case(1, "second");
    progress.phase_done("forward: fp32", 300);
  }
  std::fclose(out);
  const std::string text = buf;
  CHECK(text.find("cpdrift: [1/2] first ...\n") != std::string::npos);
  CHECK(text.find("cpdrift: [1/2] first: forward: fp32 done; 25% of the run's work in 0 s") !=
        std::string::npos);
  CHECK(text.find("about 0 s left") != std::string::npos);
  CHECK(text.find("cpdrift: [2/2] second: forward: fp32 done; 100% of the run's work") !=
        std::string::npos);
  CHECK(text.find("left\ncpdrift: [2/2] second ...") != std::string::npos);
}

// Takes a case's outputs and keeps nothing.
struct NullSink final : CaseSink {
  void rope(const RopeOutputs&) override {}
  void prefill_part(const CasePart&) override {}
  void prefill_case(const CaseRecord&) override {}
  void paged_case(const PagedCaseOutputs&) override {}
  void rollout_pairs(const DecodedCapture&) override {}
};

// The progress line of a case run through its schedule, captured.
std::string progress_of(const RunContext& local, const CaseSpec& spec, const CaseSchedule& s) {
  char buf[8192] = {};
  std::FILE* out = fmemopen(buf, sizeof buf, "w");
  REQUIRE(out != nullptr);
  {
    RunProgress progress({s.flops()}, out, 0.0);
    RunContext ctx = local;
    ctx.progress = &progress;
    progress.start_case(0, "c");
    NullSink sink;
    run_schedule(ctx, spec, s, sink);
  }
  std::fclose(out);
  return buf;
}

// A case of 32 tokens with the backward and dlogp, run in one process, and its schedule.
struct SmallCase {
  explicit SmallCase(const CaseSpec& s) : spec(s) {}
  Problem p = [] {
    Problem q = testing::small_problem();
    q.seq_len = 32;
    return q;
  }();
  CaseSpec spec;
  ThreadPool pool{2};
  LocalRun local{p, pool, true, 17};
  CaseSchedule schedule = schedule_case(CaseGrid(p, spec), schedule_options(local.ctx));
};

TEST_CASE("progress: a whole case names each phase once, in the order it runs them") {
  const SmallCase c({1, 2, 4, CpLayout::contiguous, Protocol::ag_rs});
  const std::string text = progress_of(c.local.ctx, c.spec, c.schedule);
  std::size_t at = 0;
  for (const char* line :
       {"[1/1] c ...\n", "[1/1] c: CP=1 reference forward done; ", "[1/1] c: forward: fp32 done; ",
        "[1/1] c: forward: bf16_inputs done; ", "[1/1] c: forward: bf16_kernel done; ",
        "[1/1] c: dlogp done; ", "[1/1] c: backward: CP=1 reference done; ",
        "[1/1] c: backward done; 100% of the run's"}) {
    const std::size_t found = text.find(line, at);
    CHECK_MESSAGE(found != std::string::npos, line << " after offset " << at << " in\n" << text);
    if (found != std::string::npos) at = found;
  }
}

TEST_CASE("schedule: a phase added in one place is executed, planned and counted") {
  SmallCase c({2, 2, 4, CpLayout::contiguous, Protocol::ag_rs});
  const Problem& p = c.p;
  CaseSchedule& s = c.schedule;
  const double before = s.flops();
  std::uint64_t before_peak = 0;
  {
    RunMemoryPlan memory(p, 4, 1);
    for (const ProcessMemory& m : memory.add_case(s, true))
      before_peak = std::max(before_peak, m.peak().bytes());
  }
  // The new phase: 1000 pairs on every rank, a 1 GB buffer on every process, a flag when it runs.
  int ran = 0;
  PhaseWork work(c.spec.num_logical_ranks());
  for (std::uint64_t& n : work.pairs) n = 1000;
  s.phases.push_back(Phase{"extra", PhaseKind::forward, work, 4.0 * p.dims.head_dim,
                           KernelRate::fp32, false,
                           [](CaseMemory& m) {
                             for (std::size_t proc = 0; proc < m.processes(); ++proc)
                               m.add_phase(proc, "extra", {{"extra buffer", 1'000'000'000}});
                           },
                           [&](CaseRun&) { ++ran; }});
  // Planned: its FLOPs in the case's sum, its buffer the new peak on every process.
  CHECK(s.flops() == before + 4.0 * 1000 * 4 * p.dims.head_dim);
  RunMemoryPlan memory(p, 4, 1);
  for (const ProcessMemory& m : memory.add_case(s, true)) {
    CHECK(m.peak().phase == "extra");
    CHECK(m.peak().bytes() > before_peak);
  }
  // Executed, and counted by the progress line as the case's last share.
  const std::string text = progress_of(c.local.ctx, c.spec, s);
  CHECK(ran == 1);
  CHECK(text.find("[1/1] c: extra done; 100% of the run's work") != std::string::npos);
  CHECK(text.find("[1/1] c: backward done; 100%") == std::string::npos);  // its share came last
}
