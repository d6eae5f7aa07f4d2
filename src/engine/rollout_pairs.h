// Trainer vs rollout (design §3): every prefill case (the trainer's layout) against every paged
// case (the rollout engine's), on the same tokens, at every position the rollout decoded. The
// inputs are keyed by (sequence, position), so rollout sequence b is the first kv_len(b) tokens
// of the trainer's sequence b: each side's rows at those positions are gathered to rank 0 as
// its case runs, and the pairs are compared once both sides have run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/range.h"
#include "engine/case_outputs.h"
#include "engine/manifest.h"
#include "engine/paged/paged_workload.h"
#include "engine/tp_lane_rows.h"

namespace cpd {

struct RunContext;

/// One side's attention output at the decoded positions, on rank 0: what the production kernel
/// wrote (the BF16-kernel path of a prefill case, the candidate lane of a paged case; the FP32
/// ones under --dtype fp32).
struct DecodedRows {
  std::string case_name;
  /// The trainer's merge of its states: "canonical" (the global block order), or the production
  /// lane's name (numerics.md §10) whose merge wrote these rows.
  std::string merge = "canonical";
  bool rollout = false;
  bool auto_split = false;  // a paged case under split-KV auto: a diagnostic, never evidence
  /// Per sequence, the KV blocks whose states the row of each decoded position merges (those
  /// that begin at or before it): the prefill case's global grid, the paged case's split plan.
  std::vector<std::vector<Range>> blocks;
  /// The prefill case's CP shards (per CP rank, its token ranges); empty for a paged case.
  std::vector<std::vector<Range>> cp_shards;
  std::vector<float> out;  // [B][Hq][q_len][D]
  std::vector<float> lse;  // [B][Hq][q_len]
  /// Through the synthetic lm_head (per head, folded in ascending head order, exactly as the
  /// dlogp legs do; under --scope layer the layer's lm_head over `layer`): the logits and the
  /// target token's logprob of each decoded token.
  std::vector<float> logits;   // [B][q_len][V]
  std::vector<float> logprob;  // [B][q_len]
  /// --scope layer: the layer's output of `out`, [B][q_len][hidden] — every head group through
  /// o_proj in ascending order (the bits of the trainer's TP chain at any TP), written in the
  /// run's dtype — which the logits above then read, through the layer's lm_head.
  std::vector<float> layer;
  /// --scope layer, rank 0: the layer's output through the side's TP-reduction lanes
  /// (numerics.md §12; the trainer's canonical merge: kTrainerTpLanes, the rollout's candidate:
  /// kRolloutTpLanes), and its logits and logprobs as above.
  struct TpLaneRows {
    TpLane lane;
    std::vector<float> layer, logits, logprob;
  };
  std::vector<TpLaneRows> tp_lanes;
};

/// What the run's two sides left on rank 0 for the pairs, and the positions to gather.
struct DecodedCapture {
  PagedWorkload workload;  // the rollout's: its decoded positions are workload.queries(b)
  int vocab_size = 0;      // the logprobs' synthetic lm_head
  std::vector<DecodedRows> trainer, rollout;
};

/// A prefill case's rows at the decoded positions, streamed to rank 0 from the logical ranks
/// that own them, and their logprobs; `written` per hosted rank (hosted_ranks order); with
/// `tp_lanes` (and --scope layer) the trainer's TP-reduction lanes too. Collective; filled on
/// rank 0.
DecodedRows gather_trainer_rows(const RunContext& ctx, const CaseGrid& grid,
                                const std::string& name,
                                const std::vector<const AttnShard*>& written,
                                const PagedWorkload& w, bool tp_lanes);

/// A paged lane's rows `lane` ([B][heads][q_len][D] of this process's query heads; null when it
/// computes none) streamed to rank 0, and their logits and logprobs through the synthetic
/// lm_head of `vocab`; `head_owner`: the process of each query head; under --scope layer, the
/// lanes of `tp` (none when null). Collective; filled on rank 0.
DecodedRows gather_rollout_rows(const RunContext& ctx, const PagedWorkload& w,
                                const std::string& name, bool auto_split,
                                const std::vector<std::vector<Range>>& plans,
                                const std::vector<int>& head_owner, const AttnShard* lane,
                                int vocab, const TpCollective* tp);

/// Whether the row of every decoded position merges the same KV blocks on both sides (block
/// starts at or before it equal): then the two sides' bits must be equal.
bool aligned(const DecodedRows& trainer, const DecodedRows& rollout, const PagedWorkload& w);

}  // namespace cpd
