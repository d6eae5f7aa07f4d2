// Trainer vs rollout pairs: which pairs must be bitwise, that an aligned pair is (trainer TP=2
// CP=2 zigzag split 16 against rollout decode, page 4, fixed split 16, on a batch that shares a
// prompt), that a misaligned one drifts, that a flipped bit fails the check, and the pair's
// logprobs and KL against an FP64 oracle.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "comm/transport.h"
#include "cpdrift/logprob_math.h"
#include "engine/rollout_pairs.h"
#include "engine/run_context.h"
#include "kernels/cpu/inputs.h"
#include "metrics/rollout_pair_metrics.h"
#include "recorded_run.h"
#include "report/run_report.h"

using namespace cpd;

namespace {

Problem pair_problem() {
  Problem p;
  p.seq_len = 64;
  p.batch = 2;
  return p;
}

// One in-process run of `trainer` (prefill cases) and `rollout` (paged cases, page 4): the
// capture both sides left for the pairs.
DecodedCapture capture_run(const std::vector<CaseSpec>& trainer,
                           const std::vector<PagedCaseSpec>& rollout, int vocab = 17) {
  const Problem p = pair_problem();
  ThreadPool pool(2);
  InputStore inputs(p, pool);
  InProcessTransport transport;
  LocalCp1Results cp1;
  const LocalCollectives local;
  RunContext ctx{p, pool, inputs, transport, local, cp1};
  DecodedCapture capture;
  capture.workload = make_paged_workload(p, 4, std::nullopt);
  capture.vocab_size = vocab;
  ctx.decoded = &capture;
  for (const CaseSpec& spec : trainer) testing::recorded_case(ctx, spec);
  testing::recorded_paged_cases(ctx, PagedOptions{4, std::nullopt, vocab}, rollout);
  return capture;
}

CaseSpec trainer_spec(std::optional<std::int64_t> split) {
  CaseSpec s;
  s.tp = 2;
  s.cp = 2;
  s.layout = CpLayout::zigzag;
  s.split = split;
  return s;
}

PagedCaseSpec decode(SplitKv split) { return PagedCaseSpec{PagedMode::decode, split}; }

DecodedRows rows_with_blocks(std::vector<std::vector<Range>> blocks) {
  DecodedRows r;
  r.blocks = std::move(blocks);
  return r;
}

}  // namespace

TEST_CASE("aligned: the blocks that begin at or before every decoded position agree") {
  PagedWorkload w;
  w.page_size = 4;
  w.q_len = 4;
  w.kv_lens = {40};  // decoded positions 36..39
  const DecodedRows grid = rows_with_blocks({{{0, 16}, {16, 32}, {32, 48}, {48, 64}}});
  // The rollout's plan stops at its length; blocks after the last decoded position never count.
  CHECK(aligned(grid, rows_with_blocks({{{0, 16}, {16, 32}, {32, 40}}}), w));
  CHECK_FALSE(aligned(grid, rows_with_blocks({{{0, 40}}}), w));  // split-KV disabled
  CHECK_FALSE(aligned(grid, rows_with_blocks({{{0, 8}, {8, 16}, {16, 32}, {32, 40}}}), w));
  // A boundary between the decoded positions: position 36 merges two blocks on one side only.
  CHECK_FALSE(aligned(grid, rows_with_blocks({{{0, 16}, {16, 32}, {32, 37}, {37, 40}}}), w));
}

TEST_CASE(
    "an aligned pair is bitwise equal on a batch with a shared prompt; misaligned pairs drift; a "
    "flipped bit fails the check") {
  const std::vector<CaseSpec> trainer{trainer_spec(16), trainer_spec(8)};
  const std::vector<PagedCaseSpec> rollout{decode(SplitKv{SplitPolicy::fixed, 16}),
                                           decode(SplitKv{SplitPolicy::disabled, 0}),
                                           decode(SplitKv{SplitPolicy::auto_select, 0})};
  DecodedCapture capture = capture_run(trainer, rollout);
  REQUIRE(capture.trainer.size() == 8);  // each case: canonical, then the 3 production lanes
  REQUIRE(capture.rollout.size() == 3);
  REQUIRE(shared_prompt_len(pair_problem()) > 0);  // sequence 1 decodes after the shared prompt
  std::vector<RolloutPair> pairs = compare_rollout_pairs(capture);
  REQUIRE(pairs.size() == 24);
  const std::uint64_t tokens = 2 * static_cast<std::uint64_t>(capture.workload.q_len);
  for (const RolloutPair& pair : pairs) {
    CAPTURE(pair.trainer);
    CAPTURE(pair.rollout);
    CAPTURE(pair.trainer_merge);
    CHECK(pair.tokens == tokens);
    CHECK(pair.out.finite());
    CHECK(pair.passed());
    if (pair.trainer_merge != "canonical") {
      // A production lane's merge of the same states: never aligned, and at CP=2 its bits
      // differ from every rollout's, the aligned one's included.
      CHECK_FALSE(pair.aligned);
      if (!pair.diagnostic) CHECK(pair.out.mismatch_count > 0);
      continue;
    }
    const bool must = &pair == &pairs[0];  // split 16 vs fixed 16: the one aligned pair
    CHECK(pair.aligned == must);
    CHECK(pair.diagnostic == (pair.rollout.find("auto") != std::string::npos));
    if (must) {
      CHECK(pair.bitwise_equal());
      CHECK(pair.rl.abs_max == 0.0);
      CHECK_FALSE(pair.rl.diverged);
    } else if (!pair.diagnostic) {
      CHECK(pair.out.mismatch_count > 0);  // other blocks, other bits: the drift is reported
      CHECK(pair.rl.tokens == tokens);
    }
  }
  RunReport report;
  report.rollout_pairs = pairs;
  CHECK(evaluate_checks(report).empty());

  // Negative control: one bit of one rollout LSE breaks the aligned pair, and the run fails.
  float& x = capture.rollout[0].lse[5];
  x = std::nextafter(x, INFINITY);
  pairs = compare_rollout_pairs(capture);
  CHECK_FALSE(pairs[0].passed());
  CHECK(pairs[0].lse.mismatch_count == 1);
  report.rollout_pairs = pairs;
  const std::vector<std::string> failed = evaluate_checks(report);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].find("the KV blocks align but the bits differ") != std::string::npos);
  CHECK(pairs[12].trainer_merge == "canonical");  // the second case's first pair
  CHECK(pairs[12].passed());  // the misaligned pair with the same rollout only reports drift
}

TEST_CASE("a pair's logprobs and KL against an FP64 oracle of the same rows") {
  const int vocab = 64;
  const DecodedCapture capture =
      capture_run({trainer_spec(8)}, {decode(SplitKv{SplitPolicy::fixed, 16})}, vocab);
  const Problem p = pair_problem();
  const PagedWorkload& w = capture.workload;
  const int hq = p.dims.num_q_heads, dim = p.dims.head_dim;
  const std::vector<float> lm = lm_head_columns(p, vocab, Range{0, std::int64_t{hq} * dim});
  // FP64 logits of token (b, i) of one side: Σ_h Σ_d out[b][h][i][d] · W[v][h·D + d].
  const auto logits64 = [&](const DecodedRows& r, int b, std::int64_t i) {
    std::vector<double> z(static_cast<std::size_t>(vocab), 0.0);
    for (int v = 0; v < vocab; ++v) {
      for (int h = 0; h < hq; ++h) {
        const float* o =
            r.out.data() + ((static_cast<std::size_t>(b) * hq + h) * w.q_len + i) * dim;
        for (int d = 0; d < dim; ++d)
          z[v] +=
              static_cast<double>(o[d]) * lm[static_cast<std::size_t>(v) * hq * dim + h * dim + d];
      }
    }
    return z;
  };
  const auto log_softmax64 = [&](const std::vector<double>& z, int target) {
    double m = z[0], sum = 0;
    for (const double x : z) m = std::max(m, x);
    for (const double x : z) sum += std::exp(x - m);
    return z[static_cast<std::size_t>(target)] - m - std::log(sum);
  };
  const DecodedRows& t = capture.trainer[0];
  const DecodedRows& r = capture.rollout[0];
  double kl_sum = 0, abs_max = 0;
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t i = 0; i < w.q_len; ++i) {
      const std::int64_t pos = w.queries(b).begin + i;
      const int target = logprob_target(b, pos, p.seq_len, vocab);
      const std::vector<double> zt = logits64(t, b, i), zr = logits64(r, b, i);
      const double lt = log_softmax64(zt, target), lr = log_softmax64(zr, target);
      const std::size_t k = static_cast<std::size_t>(b) * w.q_len + i;
      // FP32 projection over Hq·D = 4096 terms and an FP32 log-softmax: within 1e-4.
      CHECK(std::abs(r.logprob[k] - lr) < 1e-4);
      CHECK(std::abs(t.logprob[k] - lt) < 1e-4);
      abs_max = std::max(abs_max, std::abs(lt - lr));
      // KL(π_rollout ‖ π_train) in FP64.
      double mr = zr[0], mt = zt[0], sr = 0, st = 0;
      for (int v = 0; v < vocab; ++v) mr = std::max(mr, zr[v]), mt = std::max(mt, zt[v]);
      for (int v = 0; v < vocab; ++v) sr += std::exp(zr[v] - mr), st += std::exp(zt[v] - mt);
      double kl = 0;
      for (int v = 0; v < vocab; ++v) {
        const double a = zr[v] - mr - std::log(sr), c = zt[v] - mt - std::log(st);
        kl += std::exp(a) * (a - c);
      }
      kl_sum += kl;
    }
  }
  const RolloutPair pair = compare_rollout_pairs(capture).front();
  CHECK_FALSE(pair.aligned);  // split 8 vs 16: the drift is real and measured
  // |Δ| is ~1e-4 here; each side's FP32 logprob is within a few 1e-7 of its FP64 value.
  CHECK(std::abs(pair.rl.abs_max - abs_max) < 5e-6);
  CHECK(abs_max > 1e-5);
  CHECK(pair.rl.kl_exact_mean ==
        doctest::Approx(kl_sum / static_cast<double>(pair.tokens)).epsilon(0.1));
}
