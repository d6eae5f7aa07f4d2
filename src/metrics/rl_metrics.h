// The train/rollout mismatch figures RL frameworks log, over the active tokens of a logprob
// comparison, with their sign convention Δ = logp_train − logp_rollout (here: the candidate,
// the case's CP output, minus the reference, the FP32 CP=1 output cast alike):
//   |Δ| mean, std, max, p50, p99      slime train_rollout_logprob_abs_diff,
//                                     SkyRL rollout_train_logprobs_abs_diff_{mean,std,max}
//   ρ = exp(Δ): mean, std, min, max, effective sample size (Σρ)²/Σρ², the fraction outside
//     [1 − ε, 1 + ε], the truncated-IS clip fraction ρ > C (slime tis_clipfrac), χ² = E[ρ²] − 1
//   KL(π_rollout ‖ π_train) exactly over the vocabulary, and by the sampled-token estimators
//     k1 = −Δ and k3 = (ρ − 1) − log ρ (verl rollout_corr kl, k3_kl); both perplexities
//   the first token whose logprob bits differ, and the worst tokens by |Δ|.
// All in FP64 over the tokens in (sequence, position) order, so the figures are the same
// however the tokens were spread over processes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/case_outputs.h"

namespace cpd {

struct RlMetricOptions {
  double ratio_band = 0.2;  // ε: ρ outside [1 − ε, 1 + ε] counts as off
  double tis_clip = 2.0;    // C: ρ > C is clipped by truncated importance sampling
  int worst = 5;            // how many worst tokens to list
};

/// |Δ| of the tokens at distances [min, max] (max -1: no bound) from the nearest boundary, or
/// at positions [min, max] (`cpdrift compare`).
struct DistanceBin {
  std::int64_t min = 0, max = -1;
  std::uint64_t tokens = 0;
  double abs_mean = 0, abs_max = 0;
};

struct RlMetrics {
  std::uint64_t tokens = 0;
  double abs_mean = 0, abs_std = 0, abs_max = 0, abs_p50 = 0, abs_p99 = 0;
  double ratio_mean = 0, ratio_std = 0, ratio_min = 0, ratio_max = 0;
  double effective_sample_size = 0;  // (Σρ)²/Σρ²; `tokens` when every ρ is 1
  double outside_band_fraction = 0, tis_clip_fraction = 0, chi_squared = 0;
  double k1_mean = 0, k3_mean = 0;
  double kl_exact_mean = 0;  // KL(π_rollout ‖ π_train) over the whole vocabulary, per token
  double perplexity_train = 0, perplexity_rollout = 0;  // exp(−mean logp)
  bool diverged = false;                                // some token's logprob bits differ
  TokenPair first_divergent;
  std::vector<TokenPair> worst;  // by |Δ| descending, ties in token order
  /// |Δ| by distance to the nearest CP-shard and split boundary (bins 0, 1–3, 4–15, 16–63,
  /// 64+; empty when the case has no such boundary): the bug class reported at CP split
  /// boundaries and between zigzag and contiguous layouts.
  std::vector<DistanceBin> by_shard_distance, by_split_distance;
  RlMetricOptions options;
};

/// |Δ| of the tokens binned by `field` (a distance or the position): bin i holds the values in
/// [edges[i], edges[i+1] − 1], the last bin is open; tokens whose field is negative are left out.
std::vector<DistanceBin> abs_delta_bins(std::span<const TokenPair> tokens,
                                        std::int64_t TokenPair::*field,
                                        std::span<const std::int64_t> edges);

/// `tokens` in (sequence, position) order. No tokens: every figure 0.
RlMetrics compute_rl_metrics(std::span<const TokenPair> tokens,
                             const RlMetricOptions& options = {});

}  // namespace cpd
