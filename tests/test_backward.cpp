// The attention backward: the tiled kernel against the canonical block-pair definition (bit
// for bit), the whole pipeline against the analytic FP64 gradient of a naive attention
// (stated tolerance), GQA group sums, and the causal edge rows.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "core/model.h"
#include "cpdrift/attention_backward_math.h"
#include "kernels/cpu/attention_backward.h"
#include "random_rows.h"

using namespace cpd;
using cpd::testing::random_rows;
using cpd::testing::same_bits;

namespace {

constexpr int kDim = 128;
constexpr double kU = 5.9604644775390625e-08;  // 2^-24
const float kScale = ModelDims{}.softmax_scale();

// A causal single-head problem of n positions, with its canonical FP32 forward (one block).
struct Head {
  int n;
  std::vector<float> q, k, v, d_out, out, lse, delta;
  Head(int n_, std::uint64_t seed, const std::vector<float>* shared_k = nullptr,
       const std::vector<float>* shared_v = nullptr)
      : n(n_),
        q(random_rows(n_, seed)),
        k(shared_k ? *shared_k : random_rows(n_, seed + 1)),
        v(shared_v ? *shared_v : random_rows(n_, seed + 2)),
        d_out(random_rows(n_, seed + 3)),
        out(static_cast<std::size_t>(n_) * kDim),
        lse(n_),
        delta(n_) {
    for (int i = 0; i < n; ++i) {
      partial_state_row(&q[i * kDim], k.data(), v.data(), i + 1, kDim, kScale, ProbRounding::none,
                        &out[i * kDim], &lse[i]);
      delta[i] = backward_delta(&d_out[i * kDim], &out[i * kDim], kDim);
    }
  }
};

// Query block qb of `h` (its dq into `dq`) as a unit's row block, and the unit of KV block kb
// with its totals in dk, dv.
QueryBlockRows rows_of(const Head& h, Range qb, float* dq) {
  return QueryBlockRows{
      qb, &h.q[qb.begin * kDim], &h.d_out[qb.begin * kDim], &h.lse[qb.begin], &h.delta[qb.begin],
      dq};
}
BackwardUnit unit_of(const Head& h, Range kb, float* dk, float* dv) {
  BackwardUnit unit;
  unit.k = &h.k[kb.begin * kDim];
  unit.v = &h.v[kb.begin * kDim];
  unit.keys = kb;
  unit.dk_total = dk;
  unit.dv_total = dv;
  return unit;
}

// One head over the whole sequence as one query block and one KV block (the CP=1 grid).
struct Grads {
  std::vector<float> dq, dk, dv;
};
Grads kernel_grads(const Head& h, ThreadPool& pool) {
  Grads g{std::vector<float>(h.q.size()), std::vector<float>(h.k.size()),
          std::vector<float>(h.v.size())};
  BackwardUnit unit = unit_of(h, Range{0, h.n}, g.dk.data(), g.dv.data());
  unit.blocks.push_back(rows_of(h, Range{0, h.n}, g.dq.data()));
  run_backward_units(std::span<const BackwardUnit>(&unit, 1), kDim, kScale, pool);
  return g;
}

// The tiled backward of query block qb against KV block kb vs backward_block_pair, bitwise.
void check_block_pair(const Head& h, Range qb, Range kb, ThreadPool& pool) {
  const int nq = static_cast<int>(qb.size()), nk = static_cast<int>(kb.size());
  std::vector<float> dq(nq * kDim), dk(nk * kDim), dv(nk * kDim);
  BackwardUnit unit = unit_of(h, kb, dk.data(), dv.data());
  unit.blocks.push_back(rows_of(h, qb, dq.data()));
  run_backward_units(std::span<const BackwardUnit>(&unit, 1), kDim, kScale, pool);
  std::vector<float> rdq(dq.size()), rdk(dk.size()), rdv(dv.size());
  backward_block_pair(&h.q[qb.begin * kDim], &h.d_out[qb.begin * kDim], &h.lse[qb.begin],
                      &h.delta[qb.begin], qb.begin, nq, &h.k[kb.begin * kDim],
                      &h.v[kb.begin * kDim], kb.begin, nk, kDim, kScale, rdq.data(), rdk.data(),
                      rdv.data());
  CHECK(same_bits(dq.data(), rdq.data(), dq.size()));
  CHECK(same_bits(dk.data(), rdk.data(), dk.size()));
  CHECK(same_bits(dv.data(), rdv.data(), dv.size()));
}

}  // namespace

TEST_CASE("tiled backward equals the canonical block-pair definition bit for bit") {
  // A 40-row query block (three tiles, the last short) against KV blocks before it, on its
  // diagonal and straddling it. dK and dV take keys in groups (6 on AVX-512, 4 on AVX2) and the
  // rest in passes of 4, 2 and 1: 20, 40, 1, 23, 21 and (cut by the mask) 24 keys leave every
  // rest from 0 to 5.
  const Head h(80, 3);
  ThreadPool pool(2);
  for (const Range qb : {Range{40, 80}, Range{16, 56}, Range{0, 40}}) {
    for (const Range kb :
         {Range{0, 20}, Range{16, 56}, Range{40, 80}, Range{8, 9}, Range{0, 23}, Range{40, 61}}) {
      if (!(kb.begin < qb.end)) continue;
      CAPTURE(qb.begin);
      CAPTURE(kb.begin);
      CAPTURE(kb.end);
      check_block_pair(h, qb, kb, pool);
    }
  }
}

TEST_CASE("tiled backward across key chunks: dq rows stopping on either side of a chunk") {
  // dS·K runs over chunks of 128 keys: a 420 × 420 block pair (tiles whose rows stop in the
  // first, second, third and fourth chunk) and one offset so row groups straddle boundaries.
  // 420 rows are two kernel tiles (256 rows, then 164: an odd count of lane tiles, the last
  // one short), whose dK and dV continue from one tile to the next.
  const Head h(440, 21);
  ThreadPool pool(2);
  for (const Range qb : {Range{0, 420}, Range{20, 440}}) {
    CAPTURE(qb.begin);
    check_block_pair(h, qb, Range{0, 420}, pool);
  }
}

TEST_CASE("query-block folds: the unit's totals are the ordered fold of per-block partials") {
  const Head h(64, 9);
  ThreadPool pool(1);
  const Range kb{16, 32};
  const std::vector<Range> qbs{{16, 32}, {32, 48}, {48, 64}};
  std::vector<std::vector<float>> dq(qbs.size(), std::vector<float>(16 * kDim));
  std::vector<float> dk(16 * kDim), dv(16 * kDim);
  BackwardUnit unit = unit_of(h, kb, dk.data(), dv.data());
  for (std::size_t b = 0; b < qbs.size(); ++b)
    unit.blocks.push_back(rows_of(h, qbs[b], dq[b].data()));
  run_backward_units(std::span<const BackwardUnit>(&unit, 1), kDim, kScale, pool);
  std::vector<std::vector<float>> pk(3, std::vector<float>(16 * kDim)),
      pv(3, std::vector<float>(16 * kDim));
  for (std::size_t b = 0; b < qbs.size(); ++b) {
    std::vector<float> pq(16 * kDim);
    backward_block_pair(&h.q[qbs[b].begin * kDim], &h.d_out[qbs[b].begin * kDim],
                        &h.lse[qbs[b].begin], &h.delta[qbs[b].begin], qbs[b].begin, 16, unit.k,
                        unit.v, kb.begin, 16, kDim, kScale, pq.data(), pk[b].data(), pv[b].data());
    CHECK(same_bits(pq.data(), dq[b].data(), pq.size()));
  }
  std::vector<float> fk(16 * kDim), fv(16 * kDim);
  const float* tk[] = {pk[0].data(), pk[1].data(), pk[2].data()};
  const float* tv[] = {pv[0].data(), pv[1].data(), pv[2].data()};
  fold_terms(tk, fk.size(), fk.data());
  fold_terms(tv, fv.size(), fv.data());
  CHECK(same_bits(fk.data(), dk.data(), dk.size()));
  CHECK(same_bits(fv.data(), dv.data(), dv.size()));
  // Negative control: folding in another order changes bits somewhere.
  const float* reversed[] = {pk[2].data(), pk[1].data(), pk[0].data()};
  fold_terms(reversed, fk.size(), fk.data());
  CHECK_FALSE(same_bits(fk.data(), dk.data(), dk.size()));
}

namespace {

// The analytic gradient of naive causal attention in FP64, for one head, with error bounds.
//   P = softmax(S), dV = Pᵀ dO, dP = dO Vᵀ, Δ = rowsum(dO ∘ O), dS = P ∘ (dP - Δ),
//   dQ = dS K · scale, dK = dSᵀ Q · scale.
// Bound per element: every term dS_ij·x carries a relative error of at most
// (2D + n + 16)·u·(1 + |s_ij - lse_i|) — D for each dot product, n for the forward row sum
// behind lse, a handful for exp, the subtractions and the products; |s - lse| because exp
// turns the absolute error of s - lse into a relative one — and the sums over i or j add
// n·u·Σ|terms|. Four times that, summed over the terms' magnitudes, is the tolerance.
struct Reference64 {
  std::vector<double> dq, dk, dv, tol_dq, tol_dk, tol_dv;
};

Reference64 reference64(const std::vector<const Head*>& heads, int n) {
  Reference64 r;
  r.dq.assign(heads.size() * n * kDim, 0);
  r.tol_dq = r.dq;
  r.dk.assign(n * kDim, 0);
  r.dv = r.dk;
  r.tol_dk = r.dk;
  r.tol_dv = r.dk;
  const double chain = 4 * (2 * kDim + n + 16) * kU;
  for (std::size_t hi = 0; hi < heads.size(); ++hi) {
    const Head& h = *heads[hi];
    for (int i = 0; i < n; ++i) {
      std::vector<double> s(i + 1), p(i + 1), dp(i + 1);
      double m = -INFINITY, l = 0, delta = 0;
      for (int j = 0; j <= i; ++j) {
        double dot = 0, dot_v = 0;
        for (int d = 0; d < kDim; ++d) {
          dot += static_cast<double>(h.q[i * kDim + d]) * h.k[j * kDim + d];
          dot_v += static_cast<double>(h.d_out[i * kDim + d]) * h.v[j * kDim + d];
        }
        s[j] = dot * kScale;
        dp[j] = dot_v;
        m = std::max(m, s[j]);
      }
      for (int j = 0; j <= i; ++j) l += std::exp(s[j] - m);
      const double lse = m + std::log(l);
      std::vector<double> out(kDim, 0.0);
      for (int j = 0; j <= i; ++j) {
        p[j] = std::exp(s[j] - lse);
        for (int d = 0; d < kDim; ++d) out[d] += p[j] * h.v[j * kDim + d];
      }
      for (int d = 0; d < kDim; ++d) delta += h.d_out[i * kDim + d] * out[d];
      for (int j = 0; j <= i; ++j) {
        const double ds = p[j] * (dp[j] - delta);
        const double mag =
            p[j] * (std::fabs(dp[j]) + std::fabs(delta)) * (1 + std::fabs(s[j] - lse));
        for (int d = 0; d < kDim; ++d) {
          const std::size_t qi = (hi * n + i) * kDim + d,
                            kj = static_cast<std::size_t>(j) * kDim + d;
          r.dq[qi] += ds * h.k[kj] * kScale;
          r.tol_dq[qi] += chain * mag * std::fabs(h.k[kj]) * kScale;
          r.dk[kj] += ds * h.q[i * kDim + d] * kScale;
          r.tol_dk[kj] += chain * mag * std::fabs(h.q[i * kDim + d]) * kScale;
          r.dv[kj] += p[j] * h.d_out[i * kDim + d];
          r.tol_dv[kj] +=
              chain * p[j] * (1 + std::fabs(s[j] - lse)) * std::fabs(h.d_out[i * kDim + d]);
        }
      }
    }
  }
  return r;
}

}  // namespace

TEST_CASE("backward against the analytic FP64 gradient, with GQA group sums") {
  // Four query heads sharing one KV head (a Qwen3 GQA group): dK and dV of the KV head are the
  // fold of the per-head gradients in ascending head order.
  const int n = 48;
  const std::vector<float> k = random_rows(n, 100), v = random_rows(n, 101);
  const Head h0(n, 10, &k, &v), h1(n, 20, &k, &v), h2(n, 30, &k, &v), h3(n, 40, &k, &v);
  const std::vector<const Head*> heads{&h0, &h1, &h2, &h3};
  ThreadPool pool(2);
  std::vector<Grads> per_head;
  for (const Head* h : heads) per_head.push_back(kernel_grads(*h, pool));
  std::vector<float> dk(n * kDim), dv(n * kDim);
  std::vector<const float*> tk, tv;
  for (const Grads& g : per_head) {
    tk.push_back(g.dk.data());
    tv.push_back(g.dv.data());
  }
  fold_terms(tk, dk.size(), dk.data());
  fold_terms(tv, dv.size(), dv.data());
  for (float& x : dk) x *= kScale;
  const Reference64 ref = reference64(heads, n);
  double worst = 0;
  for (std::size_t hi = 0; hi < heads.size(); ++hi) {
    for (int i = 0; i < n * kDim; ++i) {
      const double got = per_head[hi].dq[i] * kScale,
                   err = std::fabs(got - ref.dq[hi * n * kDim + i]);
      CHECK(err <= ref.tol_dq[hi * n * kDim + i] + 1e-30);
      worst = std::max(worst, err / (ref.tol_dq[hi * n * kDim + i] + 1e-30));
    }
  }
  for (int i = 0; i < n * kDim; ++i) {
    CHECK(std::fabs(dk[i] - ref.dk[i]) <= ref.tol_dk[i] + 1e-30);
    CHECK(std::fabs(dv[i] - ref.dv[i]) <= ref.tol_dv[i] + 1e-30);
  }
  MESSAGE("worst dq error / bound: " << worst);
}

TEST_CASE("causal edge rows: the first row's dq is exactly 0, the last key's dv one product") {
  // Row 0 sees only key 0: P = 1, out = v_0, so dP = Δ (the same dot product) and dS = 0.
  const int n = 33;
  const Head h(n, 55);
  ThreadPool pool(1);
  const Grads g = kernel_grads(h, pool);
  for (int d = 0; d < kDim; ++d) CHECK(bits_of(g.dq[d]) == bits_of(0.0f));
  // The last key is seen by the last row only: dv = fma(P, dO, +0) = P·dO rounded once.
  float p, ds;
  backward_pair(&h.q[(n - 1) * kDim], &h.k[(n - 1) * kDim], &h.d_out[(n - 1) * kDim],
                &h.v[(n - 1) * kDim], kScale, h.lse[n - 1], h.delta[n - 1], kDim, &p, &ds);
  for (int d = 0; d < kDim; ++d) {
    CHECK(bits_of(g.dv[(n - 1) * kDim + d]) == bits_of(p * h.d_out[(n - 1) * kDim + d]));
    CHECK(bits_of(g.dk[(n - 1) * kDim + d]) == bits_of(ds * h.q[(n - 1) * kDim + d]));
  }
}
