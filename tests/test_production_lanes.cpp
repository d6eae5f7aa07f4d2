// The production lanes' merges (cpdrift/production_lanes.h) against an FP64 oracle: the exact
// attention of the row over every rank's keys. Each lane's tolerance is the bound of its BF16
// roundings; at one rank, or where only the owner's keys are visible, every lane is the
// canonical state bit for bit; and the order and precision each lane stands for do change bits
// (the negative controls: the same states at another owner, or with an FP32 running output).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpdrift/production_lanes.h"

namespace {

using cpd::ProductionLane;
using cpd::RankState;

constexpr int kDim = 16;

// One query row and, per CP rank, the keys and values it sees (BF16 values, as the kernel's).
struct Row {
  std::vector<float> q;
  std::vector<std::vector<float>> k, v;  // per rank: [n][kDim]
};

float bf16_normal(std::mt19937& g, float scale) {
  return cpd::round_bf16(std::normal_distribution<float>(0.0f, scale)(g));
}

Row random_row(std::mt19937& g, int cp, int keys_per_rank, float q_scale) {
  Row r;
  for (int d = 0; d < kDim; ++d) r.q.push_back(bf16_normal(g, q_scale));
  for (int s = 0; s < cp; ++s) {
    std::vector<float> k, v;
    for (int j = 0; j < keys_per_rank * kDim; ++j) {
      k.push_back(bf16_normal(g, 1.0f));
      v.push_back(bf16_normal(g, 1.0f));
    }
    r.k.push_back(std::move(k));
    r.v.push_back(std::move(v));
  }
  return r;
}

// Each rank's kernel call on the row: the canonical FP32 state, out written as BF16.
struct States {
  std::vector<std::vector<float>> out;
  std::vector<float> lse;
  std::vector<RankState> view() const {
    std::vector<RankState> v;
    for (std::size_t s = 0; s < out.size(); ++s) v.push_back(RankState{out[s].data(), lse[s]});
    return v;
  }
};

States rank_states(const Row& r, float scale) {
  States st;
  for (std::size_t s = 0; s < r.k.size(); ++s) {
    std::vector<float> out(kDim);
    float lse = 0;
    const int n = static_cast<int>(r.k[s].size() / kDim);
    if (n == 0) {
      lse = cpd::neg_inf_f32();
    } else {
      cpd::partial_state_row(r.q.data(), r.k[s].data(), r.v[s].data(), n, kDim, scale,
                             cpd::ProbRounding::none, out.data(), &lse);
    }
    for (float& x : out) x = cpd::round_bf16(x);
    st.out.push_back(std::move(out));
    st.lse.push_back(lse);
  }
  return st;
}

// The exact attention of the row over all ranks' keys, in FP64.
void oracle(const Row& r, double scale, std::vector<double>& out, double& lse) {
  std::vector<double> s;
  std::vector<const float*> vs;
  for (std::size_t rank = 0; rank < r.k.size(); ++rank) {
    for (std::size_t j = 0; j < r.k[rank].size() / kDim; ++j) {
      double dot = 0;
      for (int d = 0; d < kDim; ++d) dot += double(r.q[d]) * double(r.k[rank][j * kDim + d]);
      s.push_back(dot * scale);
      vs.push_back(r.v[rank].data() + j * kDim);
    }
  }
  double m = -INFINITY;
  for (double x : s) m = std::max(m, x);
  double l = 0;
  out.assign(kDim, 0.0);
  for (std::size_t j = 0; j < s.size(); ++j) {
    const double p = std::exp(s[j] - m);
    l += p;
    for (int d = 0; d < kDim; ++d) out[d] += p * vs[j][d];
  }
  for (double& x : out) x /= l;
  lse = m + std::log(l);
}

// The bound of each lane's roundings, in units of u · max|v| with u = 2^-8 (BF16's unit
// roundoff: 8 significant bits, round to nearest):
// te_p2p rounds every rank's output and every partial sum (cp + 1); ring_fp32 every rank's
// output and the final write (2); nccl_rs every rank's output, its rescaled copy and every
// sum (cp + 2). FP32 arithmetic adds 1e-5 at most at these sizes.
double roundings(ProductionLane lane, int cp) {
  switch (lane) {
    case ProductionLane::te_p2p:
      return cp + 1;
    case ProductionLane::ring_fp32:
      return 2;
    case ProductionLane::nccl_rs:
      return cp + 2;
  }
  return 0;
}

// te_p2p's order and weights with an FP32 running output (rounded once at the end): the
// negative control for its BF16 running output.
void te_order_fp32_running(const States& st, int owner, std::vector<float>& out) {
  const std::vector<RankState> v = st.view();
  const int cp = static_cast<int>(v.size());
  float total = cpd::neg_inf_f32();
  for (int i = 0; i < cp; ++i)
    total = cpd::logaddexp_f32(total, v[cpd::ring_source(owner, i, cp)].lse);
  out.assign(kDim, 0.0f);
  bool first = true;
  for (int i = 0; i < cp; ++i) {
    const RankState& s = v[cpd::ring_source(owner, i, cp)];
    if (s.lse == cpd::neg_inf_f32()) continue;
    const float w = cpd::exp_f32(s.lse - total);
    for (int d = 0; d < kDim; ++d) out[d] = first ? s.out[d] * w : out[d] + s.out[d] * w;
    first = false;
  }
  for (float& x : out) x = cpd::round_bf16(x);
}

double max_abs_v(const Row& r) {
  double m = 0;
  for (const std::vector<float>& v : r.v)
    for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

}  // namespace

TEST_CASE("every production lane is the exact attention within its BF16 roundings (FP64 oracle)") {
  std::mt19937 g(7);
  const float scale = 0.25f;
  for (const int cp : {1, 2, 3, 4, 8}) {
    for (int trial = 0; trial < 50; ++trial) {
      const Row row = random_row(g, cp, 1 + trial % 5, trial % 2 ? 3.0f : 0.5f);
      const States st = rank_states(row, scale);
      std::vector<double> want;
      double want_lse = 0;
      oracle(row, scale, want, want_lse);
      const double vmax = max_abs_v(row);
      for (const ProductionLane lane : cpd::kProductionLanes) {
        CAPTURE(std::string(cpd::to_string(lane)));
        CAPTURE(cp);
        CAPTURE(trial);
        for (int owner = 0; owner < cp; ++owner) {
          std::vector<float> out(kDim);
          float lse = 0;
          cpd::production_row(lane, st.view(), owner, kDim, out.data(), &lse);
          const double tol = roundings(lane, cp) * std::ldexp(vmax, -8) + 1e-5;
          for (int d = 0; d < kDim; ++d) {
            CHECK(std::fabs(out[d] - want[d]) <= tol);
            CHECK(cpd::round_bf16(out[d]) == out[d]);  // written as BF16
          }
          CHECK(std::fabs(lse - want_lse) <= 1e-5 * std::max(1.0, std::fabs(want_lse)) * cp);
        }
      }
    }
  }
}

TEST_CASE("at one rank, or where only the owner's keys are visible, every lane is the state") {
  std::mt19937 g(11);
  for (const int cp : {1, 2, 4}) {
    for (int trial = 0; trial < 20; ++trial) {
      Row row = random_row(g, cp, 3, 2.0f);
      const int owner = trial % cp;
      for (int s = 0; s < cp; ++s) {
        if (s != owner) row.k[s].clear(), row.v[s].clear();  // the causal mask hides them
      }
      const States st = rank_states(row, 0.125f);
      for (const ProductionLane lane : cpd::kProductionLanes) {
        CAPTURE(std::string(cpd::to_string(lane)));
        std::vector<float> out(kDim);
        float lse = 0;
        cpd::production_row(lane, st.view(), owner, kDim, out.data(), &lse);
        CHECK(lse == st.lse[owner]);
        for (int d = 0; d < kDim; ++d) CHECK(out[d] == st.out[owner][d]);
      }
    }
  }
}

TEST_CASE("a row that sees no key at all is the identity in every lane") {
  const std::vector<float> zeros(kDim, 0.0f);
  const std::vector<RankState> none(4, RankState{zeros.data(), cpd::neg_inf_f32()});
  for (const ProductionLane lane : cpd::kProductionLanes) {
    CAPTURE(std::string(cpd::to_string(lane)));
    std::vector<float> out(kDim, 1.0f);
    float lse = 0;
    cpd::production_row(lane, none, 2, kDim, out.data(), &lse);
    CHECK(lse == cpd::neg_inf_f32());
    CHECK(out == zeros);
  }
}

TEST_CASE("the ring order: step i holds rank (r - i) mod cp, the diagonal first") {
  CHECK(cpd::ring_source(0, 0, 4) == 0);
  CHECK(cpd::ring_source(0, 1, 4) == 3);
  CHECK(cpd::ring_source(2, 1, 4) == 1);
  CHECK(cpd::ring_source(2, 3, 4) == 3);
  CHECK(cpd::ring_source(1, 1, 2) == 0);
}

TEST_CASE("negative controls: the order and the precision a lane stands for change bits") {
  std::mt19937 g(3);
  int order_differs = 0, precision_differs = 0, rs_start_differs = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Row row = random_row(g, 4, 4, 2.0f);
    const States st = rank_states(row, 0.25f);
    std::vector<float> a(kDim), b(kDim), c(kDim);
    float la = 0, lb = 0;
    // The same four states merged at owners 0 and 1: another ring order.
    cpd::te_p2p_row(st.view(), 0, kDim, a.data(), &la);
    cpd::te_p2p_row(st.view(), 1, kDim, b.data(), &lb);
    te_order_fp32_running(st, 0, c);
    if (a != b) ++order_differs;
    if (a != c) ++precision_differs;  // BF16 vs FP32 running output, same order and weights
    cpd::nccl_rs_row(st.view(), 0, kDim, a.data(), &la);
    cpd::nccl_rs_row(st.view(), 2, kDim, b.data(), &lb);
    if (a != b) ++rs_start_differs;  // another start of the reduce-scatter ring
  }
  CHECK(order_differs > 0);
  CHECK(precision_differs > 0);
  CHECK(rs_start_differs > 0);
}

TEST_CASE("te_p2p backward ring order: the K/V each rank holds, simulated send by send") {
  // Transformer Engine's backward starts from the K/V the forward ended with (rank r's last
  // forward step held rank (r − (cp − 1))'s, i.e. r + 1's) and each step sends its buffer to
  // rank r − 1 and receives rank r + 1's. Simulating those moves gives, at every step, which
  // K/V (and travelling dK/dV) each rank holds: te_backward_kv_source must say the same, and
  // te_backward_dkv_visitor must name the rank holding a KV rank's buffer at each step.
  for (const int cp : {1, 2, 3, 4, 8}) {
    std::vector<int> held(static_cast<std::size_t>(cp));  // held[r]: the K/V rank r holds
    for (int r = 0; r < cp; ++r)
      held[static_cast<std::size_t>(r)] = cpd::ring_source(r, cp - 1, cp);
    for (int step = 0; step < cp; ++step) {
      for (int r = 0; r < cp; ++r) {
        CAPTURE(cp);
        CAPTURE(step);
        CAPTURE(r);
        const int s = held[static_cast<std::size_t>(r)];
        CHECK(cpd::te_backward_kv_source(r, step, cp) == s);
        CHECK(cpd::te_backward_dkv_visitor(s, step, cp) == r);
      }
      std::vector<int> next(held.size());  // every rank receives from rank + 1
      for (int r = 0; r < cp; ++r)
        next[static_cast<std::size_t>(r)] = held[static_cast<std::size_t>((r + 1) % cp)];
      held = next;
    }
    // The diagonal is the last step's, on every rank (TE's `i == cp_size - 1`).
    for (int r = 0; r < cp; ++r) CHECK(cpd::te_backward_kv_source(r, cp - 1, cp) == r);
  }
  // Negative control: the forward's order is another one from CP = 3 on.
  CHECK(cpd::te_backward_kv_source(0, 0, 3) != cpd::ring_source(0, 0, 3));
}
