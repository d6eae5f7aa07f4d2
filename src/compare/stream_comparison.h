// Two engines' logprob streams aligned by (sequence, position) and measured with the figures RL
// frameworks log (metrics/rl_metrics.h). Fail-closed: anything that makes the pairing doubtful
// is an invalid comparison, never a drift figure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compare/logprob_stream.h"
#include "metrics/rl_metrics.h"

namespace cpd {

/// What two engines' top-k lists say of the active tokens where both streams carry one: how much
/// the lists agree (Jaccard overlap of the ids, the same top-1 id) and how far the logprobs of
/// the ids in both lists are apart. No KL: a top-k list does not give one.
struct TopkFigures {
  bool available = false;
  std::string reason;                              // why not, when not
  std::uint64_t tokens = 0;                        // with a list on both sides
  double overlap_mean = 0, overlap_min = 0;        // |A ∩ B| / |A ∪ B|
  double top1_agreement = 0;                       // share of tokens whose best ids are the same
  std::uint64_t common_entries = 0;                // Σ |A ∩ B|
  double common_abs_mean = 0, common_abs_max = 0;  // |logp_train(v) − logp_rollout(v)|, v ∈ A ∩ B
};

struct StreamComparison {
  /// The active tokens in (sequence, position) order: train = TRAIN's logprob, rollout =
  /// ROLLOUT's, kl = KL(π_rollout ‖ π_train) over the vocabulary when both streams have it.
  std::vector<TokenPair> tokens;
  std::vector<std::int64_t> token_ids;                    // per token
  std::vector<std::size_t> train_record, rollout_record;  // per token: the records' indices
  std::uint64_t records = 0;   // aligned records, active or not (each stream has exactly these)
  std::uint64_t inactive = 0;  // aligned records with "active": false on both sides
  std::uint64_t sequences = 0;
  std::int64_t first_position = 0, last_position = 0;  // over the active tokens
  bool exact_kl = false;  // every active token had both full-vocabulary rows
  std::string exact_kl_reason;
  RlMetrics metrics;
  TopkFigures topk;
  /// |Δ| by position: 0–63, 64–255, 256–1023, 1024–4095, 4096–16383, 16384–65535, 65536+, up
  /// to the last bin that holds a token.
  std::vector<DistanceBin> by_position;
};

/// Aligns and measures. Throws UsageError ("invalid comparison: …", one line naming the first
/// offending record) when: a logprob or vocabulary logprob is not finite; a (sequence,
/// position) appears twice in one stream or in one stream only; the token ids or the "active"
/// flags differ at a position; the vocabulary rows differ in size or do not cover the token; a
/// top-k list names an id twice or holds a non-finite logprob; no token is active.
StreamComparison compare_streams(const LogprobStream& train, const LogprobStream& rollout,
                                 const RlMetricOptions& options = {});

}  // namespace cpd
