// The RL frameworks' train/rollout figures (metrics/rl_metrics.h) against a plain FP64
// computation written out here, on tokens whose logprobs are exact in FP32, and their edge
// cases: no tokens, identical logprobs, ties among the worst tokens.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpdrift/logprob_math.h"
#include "metrics/rl_metrics.h"
#include "random_rows.h"

using namespace cpd;

namespace {

std::vector<TokenPair> tokens_of(const std::vector<float>& train,
                                 const std::vector<float>& rollout) {
  std::vector<TokenPair> t;
  for (std::size_t i = 0; i < train.size(); ++i)
    t.push_back(TokenPair{static_cast<int>(i / 4), static_cast<std::int64_t>(i % 4 + 1),
                          static_cast<int>(i % 2), train[i], rollout[i]});
  return t;
}

bool close(double a, double b) { return std::fabs(a - b) <= 1e-12 * std::max(1.0, std::fabs(b)); }

}  // namespace

TEST_CASE("rl metrics: every figure against a plain FP64 computation") {
  // Deltas 0.5, -0.25, 1.0 (ρ = e > 2: clipped), 0, -0.75, 0.125, 0.0625, -1.5.
  const std::vector<float> rollout = {-1.0f, -2.0f, -3.0f, -0.5f, -1.25f, -4.0f, -2.5f, -0.25f};
  const std::vector<float> train = {-0.5f, -2.25f, -2.0f, -0.5f, -2.0f, -3.875f, -2.4375f, -1.75f};
  const std::vector<TokenPair> t = tokens_of(train, rollout);
  const RlMetrics m = compute_rl_metrics(t);

  const double n = static_cast<double>(t.size());
  std::vector<double> d, a;
  for (std::size_t i = 0; i < t.size(); ++i) {
    d.push_back(static_cast<double>(train[i]) - rollout[i]);
    a.push_back(std::fabs(d.back()));
  }
  double mean_a = 0, mean_r = 0, r_sq = 0, k1 = 0, k3 = 0, rmin = 1e300, rmax = -1e300;
  int outside = 0, clipped = 0;
  for (const double x : d) {
    const double r = std::exp(x);
    mean_a += std::fabs(x) / n;
    mean_r += r / n;
    r_sq += r * r;
    k1 += -x / n;
    k3 += (r - 1 - std::log(r)) / n;
    rmin = std::min(rmin, r);
    rmax = std::max(rmax, r);
    outside += (r < 0.8 || r > 1.2) ? 1 : 0;
    clipped += r > 2.0 ? 1 : 0;
  }
  double var_a = 0, var_r = 0;
  for (const double x : d) {
    var_a += (std::fabs(x) - mean_a) * (std::fabs(x) - mean_a) / n;
    var_r += (std::exp(x) - mean_r) * (std::exp(x) - mean_r) / n;
  }
  std::vector<double> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  // numpy's default quantile: p50 between ranks 3 and 4 (0.25, 0.5), p99 at rank 6.93.
  const double p50 = sorted[3] + (sorted[4] - sorted[3]) * 0.5;
  const double p99 = sorted[6] + (sorted[7] - sorted[6]) * (0.99 * 7 - 6);

  CHECK(m.tokens == 8);
  CHECK(close(m.abs_mean, mean_a));
  CHECK(close(m.abs_std, std::sqrt(var_a)));
  CHECK(m.abs_max == 1.5);
  CHECK(close(m.abs_p50, p50));
  CHECK(close(m.abs_p99, p99));
  CHECK(close(m.ratio_mean, mean_r));
  CHECK(close(m.ratio_std, std::sqrt(var_r)));
  CHECK(close(m.ratio_min, rmin));
  CHECK(close(m.ratio_max, rmax));
  CHECK(close(m.effective_sample_size, mean_r * n * mean_r * n / r_sq));
  CHECK(m.outside_band_fraction == outside / n);
  CHECK(m.tis_clip_fraction == clipped / n);
  CHECK(clipped == 1);
  CHECK(close(m.chi_squared, r_sq / n - 1));
  CHECK(close(m.k1_mean, k1));
  CHECK(close(m.k3_mean, k3));
  // The first divergent token is the first one; the worst, by |Δ|: 1.5, 1.0, 0.75, 0.5, 0.25.
  CHECK(m.diverged);
  CHECK(m.first_divergent.sequence == 0);
  CHECK(m.first_divergent.position == 1);
  REQUIRE(m.worst.size() == 5);
  const std::int64_t expected[5][2] = {{1, 4}, {0, 3}, {1, 1}, {0, 1}, {0, 2}};
  for (int i = 0; i < 5; ++i) {
    CHECK(m.worst[static_cast<std::size_t>(i)].sequence == expected[i][0]);
    CHECK(m.worst[static_cast<std::size_t>(i)].position == expected[i][1]);
  }
}

TEST_CASE("rl metrics: identical logprobs are no drift at all; none is every figure 0") {
  const std::vector<float> x = {-1.0f, -2.0f, -0.125f, -7.0f, -1.0f};
  const RlMetrics m = compute_rl_metrics(tokens_of(x, x));
  CHECK(m.tokens == 5);
  CHECK_FALSE(m.diverged);
  CHECK(m.abs_max == 0.0);
  CHECK(m.abs_mean == 0.0);
  CHECK(m.ratio_min == 1.0);
  CHECK(m.ratio_max == 1.0);
  CHECK(m.effective_sample_size == 5.0);
  CHECK(m.chi_squared == 0.0);
  CHECK(m.k1_mean == 0.0);
  CHECK(m.k3_mean == 0.0);
  // Ties keep token order.
  REQUIRE(m.worst.size() == 5);
  for (std::size_t i = 0; i < 5; ++i)
    CHECK(m.worst[i].position == static_cast<std::int64_t>(i % 4 + 1));
  // Negative control: one differing bit anywhere is a divergence, and it is found.
  std::vector<float> y = x;
  y[3] = std::nextafter(y[3], 0.0f);
  const RlMetrics d = compute_rl_metrics(tokens_of(y, x));
  CHECK(d.diverged);
  CHECK(d.first_divergent.position == 4);
  CHECK(d.abs_max > 0.0);
  const RlMetrics none = compute_rl_metrics({});
  CHECK(none.tokens == 0);
  CHECK(none.worst.empty());
  CHECK_FALSE(none.diverged);
}

TEST_CASE("rl metrics: |delta| binned by distance to the nearest boundary") {
  // Six tokens at split distances 0, 0, 2, 5, 70 and none; |Δ| 0.5, 0.25, 1, 0, 0.125, 4.
  std::vector<TokenPair> t = tokens_of({-0.5f, -2.25f, -2.0f, -0.5f, -4.125f, -5.0f},
                                       {-1.0f, -2.0f, -3.0f, -0.5f, -4.0f, -1.0f});
  const std::int64_t split[] = {0, 0, 2, 5, 70, -1};
  for (std::size_t i = 0; i < t.size(); ++i) t[i].split_distance = split[i];
  const RlMetrics m = compute_rl_metrics(t);
  REQUIRE(m.by_split_distance.size() == 5);
  const std::uint64_t counts[] = {2, 1, 1, 0, 1};
  const double means[] = {0.375, 1.0, 0.0, 0.0, 0.125}, maxima[] = {0.5, 1.0, 0.0, 0.0, 0.125};
  const std::int64_t mins[] = {0, 1, 4, 16, 64}, maxs[] = {0, 3, 15, 63, -1};
  for (std::size_t b = 0; b < 5; ++b) {
    CAPTURE(b);
    CHECK(m.by_split_distance[b].min == mins[b]);
    CHECK(m.by_split_distance[b].max == maxs[b]);
    CHECK(m.by_split_distance[b].tokens == counts[b]);
    CHECK(m.by_split_distance[b].abs_mean == means[b]);
    CHECK(m.by_split_distance[b].abs_max == maxima[b]);
  }
  // No token has a CP-shard distance: no bins rather than empty ones.
  CHECK(m.by_shard_distance.empty());
}

TEST_CASE("rl metrics: the exact KL over the vocabulary and the perplexities") {
  // KL of two 2-token distributions, (1/2, 1/2) against (1/4, 3/4), and of one with itself.
  const float p[2] = {0.0f, 0.0f}, q[2] = {0.0f, static_cast<float>(std::log(3.0))};
  const double expected = 0.5 * std::log(0.5 / 0.25) + 0.5 * std::log(0.5 / 0.75);
  CHECK(std::fabs(kl_divergence(p, q, 2) - expected) < 1e-7);  // q's logit is FP32-rounded
  CHECK(kl_divergence(q, q, 2) == 0.0);
  // A NaN logit, first or later, on either side: the KL is NaN, never a figure.
  const float nan = std::nanf("");
  const float nan_first[3] = {nan, 0.0f, 1.0f}, nan_later[3] = {0.0f, nan, 1.0f};
  const float finite[3] = {0.5f, 0.0f, 1.0f};
  for (const float* z : {nan_first, nan_later}) {
    CHECK(std::isnan(kl_divergence(z, finite, 3)));
    CHECK(std::isnan(kl_divergence(finite, z, 3)));
  }
  // Per-token KLs averaged; perplexities exp(-mean logp) of each side.
  std::vector<TokenPair> t = tokens_of({-1.0f, -2.0f, -3.0f}, {-1.5f, -2.0f, -2.0f});
  const float kls[] = {0.25f, 0.5f, 0.125f};
  for (std::size_t i = 0; i < t.size(); ++i) t[i].kl = kls[i];
  const RlMetrics m = compute_rl_metrics(t);
  CHECK(close(m.kl_exact_mean, (0.25 + 0.5 + 0.125) / 3));
  CHECK(close(m.perplexity_train, std::exp(2.0)));
  CHECK(close(m.perplexity_rollout, std::exp(5.5 / 3)));
}

TEST_CASE("rl metrics: the exact KL against a long double computation, on real vocabularies") {
  // Logits like a model's (spread 3) and a candidate 1e-3 off. The FP64 KL's error is that of
  // its sums: each of the 3 in-order sums of V terms errs by at most V·2^-53 relative, and each
  // term's exp_f64 by 0.86 ulp; the log-normalisers' errors enter the KL as they are (Σ p = 1).
  // The oracle does the same in long double (64-bit significand) with expl and logl.
  for (const int vocab : {1, 17, 4096, 4097, 151936}) {
    std::vector<float> p = testing::random_rows(vocab, 7, 1), q = testing::random_rows(vocab, 8, 1);
    for (std::size_t v = 0; v < p.size(); ++v) {
      p[v] = 3.0f * p[v];
      q[v] = p[v] + 1e-3f * q[v];
    }
    const auto log_norm = [&](const std::vector<float>& z) {
      long double m = z[0], sum = 0;
      for (const float x : z) m = std::max<long double>(m, x);
      for (const float x : z) sum += expl(x - m);
      return m + logl(sum);
    };
    const long double lp = log_norm(p), lq = log_norm(q);
    long double oracle = 0;
    for (std::size_t v = 0; v < p.size(); ++v)
      oracle += expl(p[v] - lp) * ((p[v] - lp) - (q[v] - lq));
    const double kl = kl_divergence(p.data(), q.data(), vocab);
    const double tolerance = 4.0 * vocab * 0x1p-53;
    INFO("V = " << vocab << ": KL " << kl << ", oracle " << static_cast<double>(oracle));
    CHECK(std::fabs(kl - static_cast<double>(oracle)) <= tolerance);
    CHECK(kl_divergence(p.data(), p.data(), vocab) == 0.0);  // log p - log q is exactly 0
  }
}
