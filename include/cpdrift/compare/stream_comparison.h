// Two engines' logprob streams aligned by (sequence, position) and measured with the figures RL
// frameworks log (metrics/rl_metrics.h). Fail-closed: anything that makes the pairing doubtful
// is an invalid comparison, never a drift figure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpdrift/compare/logprob_stream.h"
#include "cpdrift/metrics/rl_metrics.h"

namespace cpd {

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
  /// |Δ| by position: 0–63, 64–255, 256–1023, 1024–4095, 4096–16383, 16384–65535, 65536+, up
  /// to the last bin that holds a token.
  std::vector<DistanceBin> by_position;
};

/// Aligns and measures. Throws UsageError ("invalid comparison: …", one line naming the first
/// offending record) when: a logprob or vocabulary logprob is not finite; a (sequence,
/// position) appears twice in one stream or in one stream only; the token ids or the "active"
/// flags differ at a position; the vocabulary rows differ in size or do not cover the token;
/// no token is active.
StreamComparison compare_streams(const LogprobStream& train, const LogprobStream& rollout,
                                 const RlMetricOptions& options = {});

}  // namespace cpd
