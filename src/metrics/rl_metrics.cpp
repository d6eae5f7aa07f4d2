#include "metrics/rl_metrics.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "metrics/diff_stats.h"

namespace cpd {
namespace {

// Population standard deviation from the sums of x and x² over n values.
double stddev(double sum, double sum_sq, double n) {
  const double mean = sum / n;
  return std::sqrt(std::max(0.0, sum_sq / n - mean * mean));
}

}  // namespace

std::vector<DistanceBin> abs_delta_bins(std::span<const TokenPair> tokens,
                                        std::int64_t TokenPair::*field,
                                        std::span<const std::int64_t> edges) {
  std::vector<DistanceBin> bins;
  for (std::size_t i = 0; i < edges.size(); ++i)
    bins.push_back(DistanceBin{edges[i], i + 1 < edges.size() ? edges[i + 1] - 1 : -1});
  for (const TokenPair& t : tokens) {
    const std::int64_t d = t.*field;
    if (d < 0 || bins.empty() || d < bins[0].min) continue;
    std::size_t b = bins.size() - 1;
    while (d < bins[b].min) --b;
    const double a = std::fabs(t.train - t.rollout);
    ++bins[b].tokens;
    bins[b].abs_mean += a;  // the sum until it is divided below
    bins[b].abs_max = std::max(bins[b].abs_max, a);
  }
  for (DistanceBin& b : bins) {
    if (b.tokens > 0) b.abs_mean /= static_cast<double>(b.tokens);
  }
  return bins;
}

RlMetrics compute_rl_metrics(std::span<const TokenPair> tokens, const RlMetricOptions& options) {
  RlMetrics m;
  m.options = options;
  m.tokens = tokens.size();
  if (tokens.empty()) return m;
  const double n = static_cast<double>(tokens.size());
  double abs_sum = 0, abs_sq = 0, r_sum = 0, r_sq = 0, k1 = 0, k3 = 0, kl = 0, lp_train = 0,
         lp_rollout = 0;
  std::uint64_t outside = 0, clipped = 0;
  std::vector<double> abs_sorted;
  abs_sorted.reserve(tokens.size());
  m.ratio_min = m.ratio_max = std::exp(static_cast<double>(tokens[0].train) - tokens[0].rollout);
  for (const TokenPair& t : tokens) {
    const double delta = static_cast<double>(t.train) - static_cast<double>(t.rollout);
    const double a = std::fabs(delta), rho = std::exp(delta);
    abs_sum += a;
    abs_sq += a * a;
    m.abs_max = std::max(m.abs_max, a);
    abs_sorted.push_back(a);
    r_sum += rho;
    r_sq += rho * rho;
    m.ratio_min = std::min(m.ratio_min, rho);
    m.ratio_max = std::max(m.ratio_max, rho);
    if (rho < 1.0 - options.ratio_band || rho > 1.0 + options.ratio_band) ++outside;
    if (rho > options.tis_clip) ++clipped;
    k1 += -delta;
    k3 += (rho - 1.0) - delta;  // log ρ = Δ
    kl += t.kl;
    lp_train += t.train;
    lp_rollout += t.rollout;
    if (!m.diverged &&
        std::bit_cast<std::uint64_t>(t.train) != std::bit_cast<std::uint64_t>(t.rollout)) {
      m.diverged = true;
      m.first_divergent = t;
    }
  }
  m.abs_mean = abs_sum / n;
  m.abs_std = stddev(abs_sum, abs_sq, n);
  std::sort(abs_sorted.begin(), abs_sorted.end());
  m.abs_p50 = sorted_quantile(abs_sorted, 0.50);
  m.abs_p99 = sorted_quantile(abs_sorted, 0.99);
  m.ratio_mean = r_sum / n;
  m.ratio_std = stddev(r_sum, r_sq, n);
  m.effective_sample_size = r_sum * r_sum / r_sq;
  m.outside_band_fraction = static_cast<double>(outside) / n;
  m.tis_clip_fraction = static_cast<double>(clipped) / n;
  m.chi_squared = r_sq / n - 1.0;
  m.k1_mean = k1 / n;
  m.k3_mean = k3 / n;
  m.kl_exact_mean = kl / n;
  m.perplexity_train = std::exp(-lp_train / n);
  m.perplexity_rollout = std::exp(-lp_rollout / n);
  // The worst tokens: by |Δ| descending; a stable order keeps ties in token order.
  std::vector<std::size_t> order(tokens.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const std::size_t keep =
      std::min<std::size_t>(static_cast<std::size_t>(std::max(0, options.worst)), order.size());
  const auto abs_of = [&](std::size_t i) {
    return std::fabs(static_cast<double>(tokens[i].train) - tokens[i].rollout);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return abs_of(a) > abs_of(b); });
  for (std::size_t i = 0; i < keep; ++i) m.worst.push_back(tokens[order[i]]);
  // Bins 0, 1–3, 4–15, 16–63, 64+; none when the case has no such boundary.
  constexpr std::int64_t kEdges[] = {0, 1, 4, 16, 64};
  const auto by = [&](std::int64_t TokenPair::*distance) {
    const bool any = std::any_of(tokens.begin(), tokens.end(),
                                 [&](const TokenPair& t) { return t.*distance >= 0; });
    return any ? abs_delta_bins(tokens, distance, kEdges) : std::vector<DistanceBin>{};
  };
  m.by_shard_distance = by(&TokenPair::shard_distance);
  m.by_split_distance = by(&TokenPair::split_distance);
  return m;
}

}  // namespace cpd
