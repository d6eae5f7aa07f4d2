// The training side (design §3): the FP32 attention backward of a case from its saved
// forward, distributed on the global block grid, and the CP=1 reference it is measured against.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "comm/collectives.h"
#include "engine/local_cp1.h"
#include "engine/protocol.h"

namespace cpd {

/// A production lane's gradients (BF16 values), shaped as RankGradients' own.
struct LaneGradients {
  Shard dq, dk, dv;
};

/// Gradients of one logical rank hosted here.
struct RankGradients {
  LogicalRank rank;
  Shard dq;                                // [B][its query heads][its tokens][D]
  Shard dk, dv;                            // [B][its KV heads][its tokens][D]
  std::vector<MessageHeader> dq_partials;  // the partial dq folded into dq, as validated
  /// The te_p2p lane's backward (numerics.md §10), when asked: Transformer Engine's backward
  /// ring, each step's (query CP rank, KV CP rank) pair written in BF16 and the steps summed in
  /// BF16 in its order — dq on the query rank over KV ranks r+1, r+2, …, r; dK/dV with their K/V
  /// over query ranks s−1, s−2, …, s (the diagonal last). A pair's gradients are the canonical
  /// FP32 sums restricted to the pair.
  std::optional<LaneGradients> te_p2p;
};

/// The FP32 backward from the saved forward (`forward`: the FP32 path's merged out and lse),
/// dO generated like the inputs. Data moves ag_rs-style whatever the forward protocol: query
/// owners send (q, dO, lse, Δ) of their ranges to the owners of the KV blocks those ranges
/// see; KV owners compute every block pair, fold dK/dV over the query blocks and then the GQA
/// group, and send each partial dq back, where it is folded in block order. Every message is
/// checked against the manifest. Collective over the transport's processes.
/// `te_p2p_lane`: also the te_p2p lane's gradients (the backend must have_lane_partials; the
/// canonical gradients' bits do not change). It holds, per KV block, each query CP rank's
/// dK/dV sums beside the total: up to CP times the dK/dV totals per query head more.
std::vector<RankGradients> run_backward(const CaseGrid& grid,
                                        const std::vector<RankOutput>& forward,
                                        Transport& transport, InputStore& inputs,
                                        bool te_p2p_lane = false);

/// The CP=1 reference backward (`cp1_backward_reference`: one block [0, S), from the CP=1 FP32
/// forward) computed locally from the input memo, a few GQA groups at a time (their forward,
/// dq and key totals are all it holds beyond the result); results memoised up to a budget.
class LocalCp1Backward {
 public:
  explicit LocalCp1Backward(std::size_t budget_bytes = kCp1MemoBytes)
      : budget_bytes_(budget_bytes) {}

  /// dq of `q_rows` (query heads, tokens) and dk/dv of `kv_rows` (the matching KV heads).
  struct Result {
    Shard dq, dk, dv;
  };
  /// `forward`: the CP=1 FP32 forward (out, lse) of q_rows' heads over rows [first, S) at
  /// least, first being the least row of q_rows and kv_rows (rows from [0, S) hold it), used
  /// instead of computing it; the same bits either way (the kernels are row-independent).
  /// Shared with the memo, which keeps it (without a copy) while its budget allows.
  std::shared_ptr<const Result> get(InputStore& inputs, const ShardShape& q_rows,
                                    const ShardShape& kv_rows, const AttnShard* forward = nullptr);

  /// Keeps nothing new from now on (what is held is still served): for the run's last case.
  void stop_memoising() { budget_bytes_ = 0; }

 private:
  struct Entry {
    ShardShape q_rows, kv_rows;
    std::shared_ptr<const Result> result;
  };
  std::vector<Entry> entries_;
  std::size_t budget_bytes_;
  std::size_t held_bytes_ = 0;
};

/// The CP=1 reference backward of every logical rank hosted here (hosted_ranks order), computed
/// once per TP group from the CP=1 FP32 forward the case computed (`reference`: each hosted
/// rank's out and lse, hosted_ranks order): the group's KV heads are shared among its CP ranks
/// (reference_kv_heads); each round, every rank of the group sends the rows of the round's KV
/// heads to the CP rank computing them (so no rank computes a forward it was given), which
/// computes their gradients over the whole sequence (`memo`, rows [0, S): the bits do not depend
/// on where it runs or from which row — rows before a key add +0 to its dK and dV) and sends
/// every rank of the group the rows it owns; every message is checked against the manifest. A
/// round computes as many KV heads as keep the widest process's threads busy (one unit per query
/// head and batch entry). Collective over the transport's processes.
std::vector<LocalCp1Backward::Result> shared_cp1_backward(
    const CaseGrid& grid, Transport& transport, const Collectives& collectives, InputStore& inputs,
    LocalCp1Backward& memo, const std::vector<const AttnShard*>& reference);

}  // namespace cpd
