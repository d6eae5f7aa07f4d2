// `cpdrift plan`'s predictions against what runs: the bytes every pair of logical ranks
// exchanges (counted by a transport that tallies each delivered message) and the (row, key)
// pairs the kernels evaluate (their own counters), exactly, for every protocol, layout, split and
// round size, forward, backward and dlogp; the closed-form pair count against a loop.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "case_digests.h"
#include "engine/backward.h"
#include "engine/case_runner.h"
#include "engine/dlogp.h"
#include "engine/local_run.h"
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
              CAPTURE(case_name(spec, p.dtype));
              CAPTURE(round_rows);
              const CaseWork plan = plan_case_work(grid, true, vocab);
              ThreadPool pool(2);
              InputStore inputs(p, pool);
              TallyingTransport transport(spec.num_logical_ranks());

              const KernelWork k0 = kernel_work();
              const std::vector<RankOutput> fwd = run_protocol(grid, kFp32, transport, inputs, {});
              const KernelWork k1 = kernel_work();
              CHECK(transport.take() == plan.forward.bytes_between);
              CHECK(k1.forward_pairs - k0.forward_pairs == plan.forward.total_pairs());

              run_backward(grid, fwd, transport, inputs);
              const KernelWork k2 = kernel_work();
              CHECK(transport.take() == plan.backward.bytes_between);
              CHECK(k2.backward_pairs - k1.backward_pairs == plan.backward.total_pairs());
              CHECK(k2.forward_pairs == k1.forward_pairs);

              std::vector<const AttnShard*> outs;
              for (const RankOutput& o : fwd) outs.push_back(&o.merged);
              run_dlogp(grid, outs, outs, vocab, transport, inputs);
              CHECK(transport.take() == plan.dlogp.bytes_between);
              ++checked;
            }
          }
        }
      }
    }
  }
  CHECK(checked >= 40);
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
  CHECK(ran == plan_case_work(grid, false, 0).forward.bytes_between);
  // Rounds of 3 rows send more state messages (more headers) for the same payload.
  CHECK(ran != plan_case_work(other, false, 0).forward.bytes_between);
}

TEST_CASE("plan: a whole case's kernel pairs and bytes are what run_case counts") {
  Problem p = testing::small_problem();
  p.seq_len = 32;
  for (const Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv}) {
    for (const std::optional<std::int64_t> split : {std::optional<std::int64_t>{}, {4}}) {
      for (const auto& [tp, cp] : {std::pair{1, 1}, {2, 2}, {1, 4}}) {
        const CaseSpec spec{tp, cp, split, CpLayout::zigzag, protocol};
        CAPTURE(case_name(spec, p.dtype));
        ThreadPool pool(2);
        LocalRun local(p, pool, true, 17);
        const RunContext& ctx = local.ctx;

        const CaseWork plan = plan_case_work(CaseGrid(p, spec), true, ctx.vocab_size);
        const std::uint64_t passes = forward_paths(p.dtype, false, false).size();
        std::uint64_t reference_forward = 0, reference_backward = 0;
        for (const std::uint64_t n : plan.reference_forward_pairs) reference_forward += n;
        for (const std::uint64_t n : plan.reference_backward_pairs) reference_backward += n;

        const KernelWork k0 = kernel_work();
        const CaseResult c = testing::recorded_case(ctx, spec);
        const KernelWork k1 = kernel_work();
        // The CP=1 reference backward starts from the reference forward: no forward of its own.
        CHECK(k1.forward_pairs - k0.forward_pairs ==
              passes * plan.forward.total_pairs() + reference_forward);
        CHECK(k1.backward_pairs - k0.backward_pairs ==
              plan.backward.total_pairs() + reference_backward);
        CHECK(c.executed.moved.bytes == passes * plan.forward.total_sent().bytes +
                                            plan.backward.total_sent().bytes +
                                            plan.dlogp.total_sent().bytes);
        CHECK(c.executed.moved.messages == passes * plan.forward.total_sent().messages +
                                               plan.backward.total_sent().messages +
                                               plan.dlogp.total_sent().messages);
      }
    }
  }
}

TEST_CASE("progress: the share of the planned work and the time left, phase by phase") {
  // Two cases of one forward path each: 100 + 0 (reference) + 0 (backward), then 300.
  const Problem p = testing::small_problem();
  const CaseWork w =
      plan_case_work(CaseGrid(p, CaseSpec{2, 2, 4, CpLayout::zigzag, Protocol::ag_rs}), true, 0);
  CaseFlops first(p, w, 1), second(p, w, 1);
  first.forward_pass = 100;
  first.reference = first.backward = 0;
  second.forward_pass = 300;
  second.reference = second.backward = 0;
  char buf[4096] = {};
  std::FILE* out = fmemopen(buf, sizeof buf, "w");
  REQUIRE(out != nullptr);
  {
    RunProgress progress({first, second}, out, 0.0);
    progress.start_case(0, "first");
    progress.path_done("FP32 path", true);
    progress.start_case(1, "second");
    progress.path_done("FP32 path", true);
  }
  std::fclose(out);
  const std::string text = buf;
  CHECK(text.find("cpdrift: [1/2] first ...\n") != std::string::npos);
  CHECK(text.find("cpdrift: [1/2] first: FP32 path and the CP=1 reference done; 25% of the "
                  "run's work in 0 s") != std::string::npos);
  CHECK(text.find("about 0 s left") != std::string::npos);
  CHECK(text.find("cpdrift: [2/2] second: FP32 path and the CP=1 reference done; 100% of the "
                  "run's work") != std::string::npos);
  CHECK(text.find("left\ncpdrift: [2/2] second ...") != std::string::npos);
}

TEST_CASE("progress: a whole case names each phase once, in the order it runs them") {
  Problem p = testing::small_problem();
  p.seq_len = 32;
  const CaseSpec spec{1, 2, 4, CpLayout::contiguous, Protocol::ag_rs};
  ThreadPool pool(2);
  LocalRun local(p, pool, true, 17);
  RunContext ctx = local.ctx;
  char buf[4096] = {};
  std::FILE* out = fmemopen(buf, sizeof buf, "w");
  REQUIRE(out != nullptr);
  {
    const CaseFlops flops(p, plan_case_work(CaseGrid(p, spec), true, ctx.vocab_size),
                          forward_paths(p.dtype, false, false).size());
    RunProgress progress({flops}, out, 0.0);
    ctx.progress = &progress;
    progress.start_case(0, "c");
    testing::recorded_case(ctx, spec);
  }
  std::fclose(out);
  const std::string text = buf;
  std::size_t at = 0;
  for (const char* line : {"[1/1] c ...\n", "[1/1] c: FP32 path and the CP=1 reference done; ",
                           "[1/1] c: BF16-inputs path done; ", "[1/1] c: BF16-kernel path done; ",
                           "[1/1] c: backward and its CP=1 reference done; 100% of the run's"}) {
    const std::size_t found = text.find(line, at);
    CHECK_MESSAGE(found != std::string::npos, line << " after offset " << at << " in\n" << text);
    if (found != std::string::npos) at = found;
  }
  CHECK(text.find("reference and the CP=1 reference") == std::string::npos);
}

TEST_CASE("progress: a case's planned FLOPs are its phases' sum") {
  const Problem p = testing::small_problem();
  const CaseWork w =
      plan_case_work(CaseGrid(p, CaseSpec{2, 2, 4, CpLayout::zigzag, Protocol::ag_rs}), true, 0);
  const CaseFlops f(p, w, 3);
  CHECK(f.forward_pass == 4.0 * p.dims.head_dim * static_cast<double>(w.forward.total_pairs()));
  CHECK(f.backward > 10.0 * p.dims.head_dim * static_cast<double>(w.backward.total_pairs()));
  CHECK(f.total() == 3 * f.forward_pass + f.reference + f.backward);
}
