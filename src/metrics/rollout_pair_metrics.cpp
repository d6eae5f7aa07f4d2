#include "metrics/rollout_pair_metrics.h"

#include <algorithm>

#include "cpdrift/logprob_math.h"

namespace cpd {
namespace {

// The interior edges between owners (owners[c] lists owner c's ranges): the first position of
// a range whose previous position belongs to another owner.
std::vector<std::int64_t> owner_edges(const std::vector<std::vector<Range>>& owners) {
  std::vector<std::int64_t> edges;
  for (const std::vector<Range>& mine : owners) {
    for (const Range& r : mine) {
      const bool continues =
          std::any_of(mine.begin(), mine.end(), [&](const Range& o) { return o.end == r.begin; });
      if (r.begin > 0 && !continues) edges.push_back(r.begin);
    }
  }
  std::sort(edges.begin(), edges.end());
  return edges;
}

DiffStats stats(const std::vector<float>& candidate, const std::vector<float>& reference) {
  const DiffPart part{candidate.data(), reference.data(), candidate.size()};
  return compute_diff_stats({&part, 1});
}

// A side's layer output, logits and logprobs: its canonical ones, or one TP-reduction lane's.
struct Side {
  const std::vector<float>& layer;
  const std::vector<float>& logits;
  const std::vector<float>& logprob;
  std::string reduction;
};
Side side(const DecodedRows& rows, const DecodedRows::TpLaneRows* lane) {
  if (lane == nullptr) return Side{rows.layer, rows.logits, rows.logprob, "canonical"};
  return Side{lane->layer, lane->logits, lane->logprob, to_string(lane->lane)};
}

RolloutPair compare(const DecodedRows& t, const DecodedRows& r, const DecodedCapture& capture,
                    const DecodedRows::TpLaneRows* t_lane = nullptr,
                    const DecodedRows::TpLaneRows* r_lane = nullptr) {
  const PagedWorkload& w = capture.workload;
  const int vocab = capture.vocab_size;
  const Side ts = side(t, t_lane), rs = side(r, r_lane);
  RolloutPair pair;
  pair.trainer = t.case_name;
  pair.rollout = r.case_name;
  pair.trainer_merge = t.merge;
  pair.trainer_tp_reduction = ts.reduction;
  pair.rollout_tp_reduction = rs.reduction;
  pair.diagnostic = r.auto_split;
  // A TP lane regroups the o_proj sums as its stack does: equal blocks do not make equal bits.
  pair.aligned = t.merge == "canonical" && t_lane == nullptr && r_lane == nullptr &&
                 !r.auto_split && aligned(t, r, w);
  pair.out = stats(t.out, r.out);
  pair.lse = stats(t.lse, r.lse);
  pair.logprob = stats(ts.logprob, rs.logprob);
  if (!t.layer.empty()) pair.layer = stats(ts.layer, rs.layer);
  const std::vector<std::int64_t> shard_edges = owner_edges(t.cp_shards);
  std::vector<std::int64_t> split_edges;
  for (const Range& b : t.blocks.front()) {
    if (b.begin > 0) split_edges.push_back(b.begin);
  }
  std::vector<TokenPair> tokens;
  for (int b = 0; b < w.sequences(); ++b) {
    for (std::int64_t i = 0; i < w.q_len; ++i) {
      const std::size_t k = static_cast<std::size_t>(b) * w.q_len + i;
      TokenPair tok;
      tok.sequence = b;
      tok.position = w.queries(b).begin + i;
      for (std::size_t c = 0; c < t.cp_shards.size(); ++c) {
        for (const Range& s : t.cp_shards[c]) {
          if (s.contains(tok.position)) tok.cp_rank = static_cast<int>(c);
        }
      }
      tok.train = ts.logprob[k];
      tok.rollout = rs.logprob[k];
      tok.kl = static_cast<float>(
          kl_divergence(rs.logits.data() + k * vocab, ts.logits.data() + k * vocab, vocab));
      tok.shard_distance = boundary_distance(shard_edges, tok.position);
      tok.split_distance = boundary_distance(split_edges, tok.position);
      tokens.push_back(tok);
    }
  }
  pair.tokens = tokens.size();
  pair.rl = compute_rl_metrics(tokens);
  return pair;
}

}  // namespace

std::vector<RolloutPair> compare_rollout_pairs(const DecodedCapture& capture) {
  std::vector<RolloutPair> pairs;
  for (const DecodedRows& t : capture.trainer) {
    for (const DecodedRows& r : capture.rollout) pairs.push_back(compare(t, r, capture));
  }
  // --scope layer: each trainer TP-reduction lane against each rollout one (the stacks users
  // run on both sides), after the canonical pairs.
  for (const DecodedRows& t : capture.trainer) {
    for (const DecodedRows& r : capture.rollout) {
      for (const DecodedRows::TpLaneRows& tl : t.tp_lanes) {
        for (const DecodedRows::TpLaneRows& rl : r.tp_lanes)
          pairs.push_back(compare(t, r, capture, &tl, &rl));
      }
    }
  }
  return pairs;
}

}  // namespace cpd
