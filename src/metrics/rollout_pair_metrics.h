// The trainer-vs-rollout pairs' figures (design §3): for each (prefill case, paged case) of a
// run, the two sides' attention output, LSE and selected-token logprobs at the rollout's
// decoded positions, with the rollout as the reference and Δ = logp_train − logp_rollout.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/rollout_pairs.h"
#include "metrics/diff_stats.h"
#include "metrics/rl_metrics.h"

namespace cpd {

struct RolloutPair {
  std::string trainer, rollout;
  std::string trainer_merge;  // "canonical" or the production lane's name
  /// --scope layer: each side's sum over its TP ranks in o_proj: "canonical" or the
  /// TP-reduction lane's name (numerics.md §12)
  std::string trainer_tp_reduction = "canonical", rollout_tp_reduction = "canonical";
  /// The row of every decoded position merges the same KV blocks on both sides: the bits must
  /// be equal, and `passed` says whether they are. Never for a production lane: its merge
  /// regroups the states, so equal blocks do not make equal bits.
  bool aligned = false;
  bool diagnostic = false;  // the rollout's split is auto: reported, never evidence
  std::uint64_t tokens = 0;
  DiffStats out, lse, logprob;
  std::optional<DiffStats> layer;  // --scope layer: the layer's output
  RlMetrics rl;

  bool bitwise_equal() const {
    return out.bitwise_equal() && lse.bitwise_equal() && logprob.bitwise_equal() &&
           (!layer || layer->bitwise_equal());
  }
  bool passed() const { return !aligned || bitwise_equal(); }
};

/// Every (trainer, rollout) pair of `capture`, trainer-major (rank 0's capture).
std::vector<RolloutPair> compare_rollout_pairs(const DecodedCapture& capture);

}  // namespace cpd
