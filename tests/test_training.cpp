// The training and logprob legs at the engine level: the backward's bitwise topology
// invariance (CP, layout, protocol, TP) with a negative control, the distributed backward
// against the local CP=1 reference, and dlogp's projection, active mask and TP invariance.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <span>

#include "case_digests.h"
#include "core/errors.h"
#include "cpdrift/logprob_math.h"
#include "engine/backward.h"
#include "engine/dlogp.h"
#include "engine/local_cp1.h"
#include "fault_transport.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/inputs.h"
#include "random_rows.h"

using namespace cpd;
using testing::kFp32;
using testing::small_problem;

namespace {

struct GradDigests {
  std::string dq, dk, dv;
  bool operator==(const GradDigests&) const = default;
};

// The digests of gradients shaped as the grid's ranks' (dq by query heads, dk and dv by KV).
GradDigests digests_of(const Problem& p, const CaseGrid& grid, const std::vector<const Shard*>& dq,
                       const std::vector<const Shard*>& dk, const std::vector<const Shard*>& dv) {
  const LocalCollectives one;
  const int dim = p.dims.head_dim;
  return GradDigests{
      stream_digest(one, global_tensor(grid, 1, 0, dim, dq), DigestFormat::fp32),
      stream_digest(one, global_tensor(grid, 1, 0, dim, dk, HeadKind::kv), DigestFormat::fp32),
      stream_digest(one, global_tensor(grid, 1, 0, dim, dv, HeadKind::kv), DigestFormat::fp32)};
}

std::vector<RankGradients> case_backward(const Problem& p, const CaseSpec& spec,
                                         std::int64_t round_rows, bool te_p2p_lane) {
  ThreadPool pool(2);
  InputStore inputs(p, pool);
  InProcessTransport transport(spec.cp * 31 + spec.tp);  // shuffled arrivals too
  const CaseGrid grid(p, spec, round_rows);
  const std::vector<RankOutput> fwd = run_protocol(grid, kFp32, transport, inputs, {});
  return run_backward(grid, fwd, transport, inputs, te_p2p_lane);
}

GradDigests backward_digests(const Problem& p, const CaseSpec& spec, std::int64_t round_rows = 0,
                             std::size_t* dq_partials = nullptr, bool te_p2p_lane = false,
                             GradDigests* lane = nullptr) {
  const std::vector<RankGradients> g = case_backward(p, spec, round_rows, te_p2p_lane);
  if (dq_partials != nullptr) {
    *dq_partials = 0;
    for (const RankGradients& r : g) *dq_partials += r.dq_partials.size();
  }
  std::vector<const Shard*> dq, dk, dv, lq, lk, lv;
  for (const RankGradients& r : g) {
    dq.push_back(&r.dq);
    dk.push_back(&r.dk);
    dv.push_back(&r.dv);
    if (r.te_p2p) {
      lq.push_back(&r.te_p2p->dq);
      lk.push_back(&r.te_p2p->dk);
      lv.push_back(&r.te_p2p->dv);
    }
  }
  const CaseGrid grid(p, spec, round_rows);
  if (lane != nullptr) *lane = digests_of(p, grid, lq, lk, lv);
  return digests_of(p, grid, dq, dk, dv);
}

}  // namespace

TEST_CASE("backward: rounds of query blocks give the bits of one round") {
  const Problem p = small_problem();
  for (const CpLayout layout : {CpLayout::contiguous, CpLayout::zigzag}) {
    const CaseSpec spec{2, 2, 4, layout, Protocol::ag_rs};
    std::size_t few = 0, many = 0;
    const GradDigests ref = backward_digests(p, spec, 32, &few);  // a CP range a round
    for (const std::int64_t rows : {1, 4, 12}) {
      CAPTURE(rows);
      CAPTURE(std::string(to_string(layout)));
      CHECK(backward_digests(p, spec, rows, &many) == ref);
      CHECK(many > few);  // the rounds ran: each one's partials are messages of their own
    }
  }
  // The rounds: consecutive blocks, ascending, as many as fit round_rows (at least one).
  const CaseGrid grid(p, CaseSpec{1, 2, 4, CpLayout::contiguous, Protocol::ag_rs}, 10);
  const std::vector<Range> spans = grid.backward_rounds();
  REQUIRE(spans.size() == 8);
  CHECK(spans.front() == Range{0, 8});
  CHECK(spans.back() == Range{56, 64});
  CHECK(CaseGrid(p, CaseSpec{1, 2, std::nullopt, CpLayout::contiguous, Protocol::ag_rs}, 10)
            .backward_rounds() == std::vector<Range>{{0, 32}, {32, 64}});
}

TEST_CASE("backward: split 8, CP=1/2/4, layouts, protocols and TP give the same dq, dk, dv bits") {
  const Problem p = small_problem();
  const GradDigests ref =
      backward_digests(p, CaseSpec{1, 1, 8, CpLayout::contiguous, Protocol::ag_rs});
  for (int cp : {1, 2, 4}) {
    for (CpLayout layout : {CpLayout::contiguous, CpLayout::zigzag}) {
      for (Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv}) {
        for (int tp : {1, 2}) {
          CAPTURE(
              case_name(CaseSpec{tp, cp, 8, layout, protocol}, testing::problem_in(DType::fp32)));
          CHECK(backward_digests(p, CaseSpec{tp, cp, 8, layout, protocol}) == ref);
        }
      }
    }
  }
}

TEST_CASE("backward te_p2p lane: BF16 ring sums of the pairs' gradients") {
  // CP=1 has one ring step: the lane is the canonical gradients rounded to BF16, bit for bit.
  // At CP=2 and 4 the steps' BF16 writes and BF16 sums change bits, within the roundings'
  // reach: each of the ≤ CP step outputs and ≤ CP - 1 sums rounds once at u = 2^-8, so
  // |lane - canonical| ≤ 2·CP·u·max|gradient| for these inputs (no cancellation across steps
  // larger than the tensor's scale); a wrong order or weight is off by O(max). The lane leaves
  // the canonical gradients' bits alone, and its own bits do not depend on TP, the protocol,
  // the rounds or the layout's processes.
  const Problem p = small_problem();
  const auto max_abs = [](std::span<const float> v) {
    float m = 0.0f;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
  };
  for (const int cp : {1, 2, 4}) {
    for (const CpLayout layout : {CpLayout::contiguous, CpLayout::zigzag}) {
      const CaseSpec spec{1, cp, 8, layout, Protocol::ag_rs};
      const std::vector<RankGradients> g = case_backward(p, spec, 0, true);
      std::size_t differ = 0, total = 0, beyond = 0;
      for (const RankGradients& r : g) {
        REQUIRE(r.te_p2p);
        const std::pair<const Shard*, const Shard*> pairs[] = {
            {&r.dq, &r.te_p2p->dq}, {&r.dk, &r.te_p2p->dk}, {&r.dv, &r.te_p2p->dv}};
        for (const auto& [canon, lane] : pairs) {
          const float scale = max_abs(canon->data);
          for (std::size_t i = 0; i < canon->data.size(); ++i) {
            const float want = round_bf16(canon->data[i]);
            differ += bits_of(want) != bits_of(lane->data[i]) ? 1 : 0;
            ++total;
            beyond +=
                std::fabs(lane->data[i] - canon->data[i]) > 2.0f * cp * std::ldexp(1.0f, -8) * scale
                    ? 1
                    : 0;
          }
        }
      }
      CAPTURE(cp);
      CAPTURE(to_string(layout));
      if (cp == 1) {
        CHECK(differ == 0);
      } else {
        CHECK(differ > 0);  // the ring's BF16 steps are not the canonical grid's
      }
      CHECK(total > 0);
      CHECK(beyond == 0);
    }
  }
  const CaseSpec base{1, 2, 8, CpLayout::zigzag, Protocol::ag_rs};
  GradDigests lane_ref;
  const GradDigests canon = backward_digests(p, base, 0, nullptr, true, &lane_ref);
  CHECK(canon == backward_digests(p, base));  // the canonical bits, with or without the lane
  for (const CaseSpec& other : {CaseSpec{2, 2, 8, CpLayout::zigzag, Protocol::ring_kv},
                                CaseSpec{4, 2, 8, CpLayout::zigzag, Protocol::allgather_kv}}) {
    GradDigests lane;
    backward_digests(p, other, 0, nullptr, true, &lane);
    CHECK(lane == lane_ref);
  }
  GradDigests rounds;
  backward_digests(p, base, 5, nullptr, true, &rounds);  // 5 query rows a round
  CHECK(rounds == lane_ref);
  GradDigests cp4;
  backward_digests(p, CaseSpec{1, 4, 8, CpLayout::zigzag, Protocol::ag_rs}, 0, nullptr, true, &cp4);
  CHECK_FALSE(cp4 == lane_ref);  // negative control: another ring, other bits
}

TEST_CASE("backward negative control: split disabled, CP=2 differs from CP=1") {
  const Problem p = small_problem();
  const GradDigests a =
      backward_digests(p, CaseSpec{1, 1, std::nullopt, CpLayout::contiguous, Protocol::ag_rs});
  const GradDigests b =
      backward_digests(p, CaseSpec{1, 2, std::nullopt, CpLayout::contiguous, Protocol::ag_rs});
  CHECK(a.dq != b.dq);
  CHECK(a.dk != b.dk);
}

TEST_CASE("backward: the distributed CP=1 prefill equals the local reference bit for bit") {
  // Same single block pair [0, S) × [0, S), computed by the two code paths.
  const Problem p = small_problem();
  ThreadPool pool(2);
  InputStore inputs(p, pool);
  InProcessTransport transport;
  const CaseGrid grid(p, CaseSpec{2, 1, std::nullopt, CpLayout::contiguous, Protocol::ag_rs});
  const std::vector<RankOutput> fwd = run_protocol(grid, kFp32, transport, inputs, {});
  const std::vector<RankGradients> g = run_backward(grid, fwd, transport, inputs);
  LocalCp1Backward reference, unmemoised(0);
  for (const RankGradients& r : g) {
    const LocalCp1Backward::Result ref = *reference.get(inputs, r.dq.shape, r.dk.shape);
    CHECK(r.dq.data == ref.dq.data);
    CHECK(r.dk.data == ref.dk.data);
    CHECK(r.dv.data == ref.dv.data);
    // Served from the memo, and computed again without one: the same bits.
    CHECK(reference.get(inputs, r.dq.shape, r.dk.shape)->dq.data == ref.dq.data);
    CHECK(unmemoised.get(inputs, r.dq.shape, r.dk.shape)->dk.data == ref.dk.data);
  }
}

namespace {

// The shared CP=1 reference backward as a case runs it: each hosted rank's CP=1 forward, its
// rows gathered by KV head, then the backward from them.
std::vector<LocalCp1Backward::Result> shared_reference(const CaseGrid& grid, Transport& transport,
                                                       InputStore& inputs, LocalCp1Backward& memo) {
  const Problem& p = grid.problem;
  std::vector<AttnShard> forward;
  for (const LogicalRank& r : hosted_ranks(grid, transport)) {
    forward.push_back(compute_local_cp1(inputs, kFp32, {Range{0, p.seq_len}},
                                        query_shape(grid, r, p.dims.head_dim)));
  }
  std::vector<const AttnShard*> rows;
  for (const AttnShard& f : forward) rows.push_back(&f);
  const LocalCollectives one;
  return shared_cp1_backward(grid, transport, one, inputs, memo, rows);
}

}  // namespace

TEST_CASE("backward: the CP=1 reference shared by KV heads equals each rank's own, bit for bit") {
  // Each rank's reference computed by itself over rows [its first row, S) (LocalCp1Backward,
  // with its own forward) vs computed once per TP group, a KV head per CP rank over the whole
  // sequence from the forward rows the group's ranks sent it, and shipped.
  // Batches of 1 and 2; 1 thread (a KV head a round) and 16 (four a round).
  for (const int batch : {1, 2}) {
    Problem p = small_problem();
    p.batch = batch;
    for (const auto& [tp, cp] : {std::pair{1, 2}, {2, 2}, {1, 4}, {2, 4}, {8, 2}, {1, 3}, {2, 3}}) {
      for (const CpLayout layout : {CpLayout::contiguous, CpLayout::zigzag}) {
        for (const int threads : {1, 16}) {
          const CaseSpec spec{tp, cp, 4, layout, Protocol::ag_rs};
          if (!validate_case(spec, p).empty()) continue;
          CAPTURE(case_name(spec, p));
          CAPTURE(batch);
          CAPTURE(threads);
          ThreadPool pool(threads);
          InputStore inputs(p, pool);
          InProcessTransport transport(7);  // shuffled arrivals
          const CaseGrid grid(p, spec);
          LocalCp1Backward memo, own(0);
          const std::vector<LocalCp1Backward::Result> shared =
              shared_reference(grid, transport, inputs, memo);
          const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
          REQUIRE(shared.size() == hosted.size());
          for (std::size_t i = 0; i < hosted.size(); ++i) {
            const LocalCp1Backward::Result mine =
                *own.get(inputs, query_shape(grid, hosted[i], p.dims.head_dim), shared[i].dk.shape);
            CHECK(testing::same_bits(shared[i].dq.data, mine.dq.data));
            CHECK(testing::same_bits(shared[i].dk.data, mine.dk.data));
            CHECK(testing::same_bits(shared[i].dv.data, mine.dv.data));
          }
        }
      }
    }
  }
}

TEST_CASE("backward: a shared reference message that goes missing is an error (negative control)") {
  const Problem p = small_problem();
  for (const MessageKind kind : {MessageKind::reference_forward, MessageKind::reference_grads}) {
    CAPTURE(to_string(kind));
    ThreadPool pool(1);
    InputStore inputs(p, pool);
    InProcessTransport inner;
    testing::FaultInjectingTransport transport(inner, kind,
                                               [](std::vector<Message>& m) { m.pop_back(); });
    const CaseGrid grid(p, CaseSpec{2, 2, 4, CpLayout::contiguous, Protocol::ag_rs});
    LocalCp1Backward memo;
    CHECK_THROWS_WITH_AS(shared_reference(grid, transport, inputs, memo),
                         doctest::Contains((std::string("missing ") + to_string(kind)).c_str()),
                         ProtocolError);
  }
}

namespace {

std::vector<float> logprobs(const Problem& p, const CaseSpec& spec, int vocab) {
  ThreadPool pool(2);
  InputStore inputs(p, pool);
  InProcessTransport transport;
  const CaseGrid grid(p, spec);
  const std::vector<RankOutput> fwd = run_protocol(grid, kFp32, transport, inputs, {});
  std::vector<const AttnShard*> outs;
  for (const RankOutput& r : fwd) outs.push_back(&r.merged);
  const std::vector<TokenLogprobs> lp = run_dlogp(grid, outs, outs, vocab, transport, inputs);
  std::vector<float> all(static_cast<std::size_t>(p.batch * p.seq_len));
  for (const TokenLogprobs& t : lp) {
    for (int b = 0; b < p.batch; ++b) {
      for (const Range& r : t.candidate.shape.tokens) {
        for (std::int64_t s = r.begin; s < r.end; ++s) {
          all[b * p.seq_len + s] = t.candidate.at(b, 0, t.candidate.shape.local_row(s))[0];
        }
      }
    }
  }
  return all;
}

}  // namespace

TEST_CASE("dlogp: TP=1, 2, 4 and CP give the same logprob bits (per-head logit grid)") {
  Problem p = small_problem();
  p.batch = 2;
  const std::vector<float> ref =
      logprobs(p, CaseSpec{1, 1, 8, CpLayout::contiguous, Protocol::ag_rs}, 17);
  for (int tp : {2, 4}) {
    for (int cp : {1, 2}) {
      const std::vector<float> got =
          logprobs(p, CaseSpec{tp, cp, 8, CpLayout::zigzag, Protocol::ag_rs}, 17);
      CAPTURE(tp);
      CAPTURE(cp);
      CHECK(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("dlogp: in steps of token chunks at V=4096, each token's canonical logprob bit for bit") {
  // At V = 4096 a step holds a few rows (logit_chunks), so the leg takes several steps, each
  // with its own messages under TP = 2; every token equals the definition computed directly:
  // per-head partial logits through lm_head_columns, folded in ascending head order,
  // log_softmax at the target. Chunks of 32 rows: the budget, 64 MiB / (2·B·32 heads·4096·4 B)
  // at B = 2.
  Problem p = small_problem();
  p.batch = 2;
  const int vocab = 4096, dim = p.dims.head_dim, hq = p.dims.num_q_heads, width = hq * dim;
  const CaseSpec one{1, 1, 8, CpLayout::contiguous, Protocol::ag_rs};
  CHECK(logit_chunk_rows(CaseGrid(p, one), vocab) == 32);
  CHECK(logit_steps(CaseGrid(p, one), vocab) == p.seq_len / 32);
  CHECK(logit_chunk_rows(CaseGrid(p, one), 17) > p.seq_len);                 // one step
  CHECK(logit_chunk_rows(CaseGrid(p, one), 1 << 17) == kLogitChunkMinRows);  // a tile at least
  // The largest chunk is the longest of the rank's chunks as listed, for a zigzag rank too
  // (two token ranges) and where the budget exceeds the ranges (V = 17).
  for (const CaseSpec& spec : {one, CaseSpec{2, 4, 8, CpLayout::zigzag, Protocol::ag_rs}}) {
    const CaseGrid grid(p, spec);
    for (int v : {17, vocab, 1 << 17}) {
      for (const LogicalRank& r : grid.ranks) {
        std::int64_t longest = 0;
        for (const Range& c : logit_chunks(grid, r, v)) longest = std::max(longest, c.size());
        CAPTURE(v);
        CHECK(largest_logit_chunk(grid, r, v) == longest);
      }
    }
  }
  const std::vector<float> got = logprobs(p, one, vocab);
  CHECK(std::memcmp(logprobs(p, CaseSpec{2, 2, 8, CpLayout::zigzag, Protocol::ag_rs}, vocab).data(),
                    got.data(), got.size() * sizeof(float)) == 0);

  ThreadPool pool(2);
  InputStore inputs(p, pool);
  InProcessTransport transport;
  const std::vector<RankOutput> fwd = run_protocol(CaseGrid(p, one), kFp32, transport, inputs, {});
  const AttnShard& out = fwd.at(0).merged;
  const std::vector<float> w = lm_head_columns(p, vocab, Range{0, width});
  std::vector<float> logits(vocab), z(vocab);
  int differ = 0;
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t s = 0; s < p.seq_len; ++s) {
      for (int h = 0; h < hq; ++h) {
        head_partial_logits(out.out.at(b, h, s), w.data() + h * dim, width, dim, vocab, z.data());
        for (int v = 0; v < vocab; ++v) logits[v] = h == 0 ? z[v] : logits[v] + z[v];
      }
      const float want =
          log_softmax_at(logits.data(), vocab, logprob_target(b, s, p.seq_len, vocab));
      differ += bits_of(want) != bits_of(got[b * p.seq_len + s]) ? 1 : 0;
    }
  }
  CHECK(differ == 0);
  // Negative control: the vocabulary of 17 gives other logprobs.
  CHECK(std::memcmp(logprobs(p, one, 17).data(), got.data(), got.size() * sizeof(float)) != 0);
}

TEST_CASE("dlogp: projection and log_softmax against an FP64 oracle") {
  // logit = Σ_h Σ_d hidden·W in FP32 with D-long fma chains and a 32-term head fold: error
  // ≤ (D + H)·u·Σ|hidden·W|; log_softmax adds a few ulps of |logit| + log V.
  Problem p;
  const int vocab = 17, width = p.dims.num_q_heads * p.dims.head_dim;
  const std::vector<float> w = lm_head_columns(p, vocab, Range{0, width});
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> hidden(width);
  for (float& x : hidden) x = normal(rng);
  std::vector<float> logits(vocab), z(vocab);
  for (int h = 0; h < p.dims.num_q_heads; ++h) {
    head_partial_logits(hidden.data() + h * p.dims.head_dim, w.data() + h * p.dims.head_dim, width,
                        p.dims.head_dim, vocab, z.data());
    for (int v = 0; v < vocab; ++v) logits[v] = h == 0 ? z[v] : logits[v] + z[v];
  }
  constexpr double kU = 5.9604644775390625e-08;
  std::vector<double> l64(vocab);
  double m = -INFINITY;
  for (int v = 0; v < vocab; ++v) {
    double acc = 0, mag = 0;
    for (int c = 0; c < width; ++c) {
      acc += static_cast<double>(hidden[c]) * w[v * width + c];
      mag += std::fabs(static_cast<double>(hidden[c]) * w[v * width + c]);
    }
    l64[v] = acc;
    CHECK(std::fabs(logits[v] - acc) <= (p.dims.head_dim + p.dims.num_q_heads) * kU * mag);
    m = std::max(m, acc);
  }
  double sum = 0;
  for (double x : l64) sum += std::exp(x - m);
  for (int target : {0, 5, 16}) {
    const double want = l64[target] - (m + std::log(sum));
    const double bound =
        1e-5 * (1 + std::fabs(want)) + (p.dims.head_dim + p.dims.num_q_heads) * kU * 64;
    CHECK(std::fabs(log_softmax_at(logits.data(), vocab, target) - want) <= bound);
  }
  // The W scale is exactly 1/64 for Hq·D = 4096: the logits are O(1).
  CHECK(w[0] == normal_at(p.seed, TensorId::lm_head, 0) / 64.0f);
}

TEST_CASE("dlogp: targets and the active mask") {
  CHECK(logprob_target(0, 0, 16, 17) == 0);
  CHECK(logprob_target(1, 3, 16, 17) == 19 % 17);
  Problem p = small_problem();
  p.batch = 3;
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  InProcessTransport transport;
  const CaseGrid grid(p, CaseSpec{1, 2, 8, CpLayout::contiguous, Protocol::ag_rs});
  const std::vector<RankOutput> fwd = run_protocol(grid, kFp32, transport, inputs, {});
  std::vector<const AttnShard*> outs;
  for (const RankOutput& r : fwd) outs.push_back(&r.merged);
  std::size_t tokens = 0;
  for (const TokenLogprobs& t : run_dlogp(grid, outs, outs, 17, transport, inputs))
    tokens += t.candidate.data.size();
  CHECK(tokens == static_cast<std::size_t>(p.batch * p.seq_len));  // every token has a logprob
}
