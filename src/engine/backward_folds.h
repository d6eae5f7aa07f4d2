// The backward's dK/dV totals, kept across its rounds, and the folds that make the gradients
// of them and of the partial dq (run_backward, backward.cpp).
#pragma once

#include <cstddef>
#include <map>
#include <tuple>
#include <vector>

#include "engine/backward.h"

namespace cpd::backward_folds {

/// The grid's query blocks inside `tokens` (blocks are cut from owner ranges, so each lies in
/// exactly one range).
std::vector<KvBlock> blocks_in(const CaseGrid& grid, const Range& tokens);

/// The dK/dV totals of the hosted KV owners, per (owner, b, KV head g, KV block) and head of the
/// group, kept across the rounds: each continues its fold over the query blocks round by round;
/// the GQA fold then sums the group's heads. With the te_p2p lane, also each query CP rank's own
/// fold over its query blocks (allocated when the rank's first block comes).
struct KvTotals {
  std::vector<FloatBuffer> head_totals;  // dk, dv per head; inner buffers stay put
  std::vector<FloatBuffer> lane_totals;  // per (fold, query CP rank): dk, dv per head
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  struct Fold {
    std::size_t grad;  // index into the gradients
    int b;
    std::int64_t g;
    KvBlock block;
    std::size_t first_total;  // head_totals index of the group's first head's dk (dv follows)
    bool started;             // some query block has been folded in
    // Per query CP rank: lane_totals index of its group's first head's dk (kNone: none yet),
    // and whether one of its query blocks has been folded in.
    std::vector<std::size_t> first_lane;
    std::vector<bool> lane_started;
  };
  std::vector<Fold> folds;
  std::map<std::tuple<std::size_t, int, std::int64_t, int>, std::size_t> index;  // → folds

  void add(std::size_t grad, int b, std::int64_t g, const KvBlock& kb, int group, int dim,
           int lane_ranks) {
    index[{grad, b, g, kb.index}] = folds.size();
    folds.push_back(Fold{grad, b, g, kb, head_totals.size(), false,
                         std::vector<std::size_t>(static_cast<std::size_t>(lane_ranks), kNone),
                         std::vector<bool>(static_cast<std::size_t>(lane_ranks), false)});
    const std::size_t n = static_cast<std::size_t>(kb.range.size()) * dim;
    // Written whole by the fold's first unit (accumulate false), which every fold has: a KV
    // block is seen by its own query block.
    for (int x = 0; x < 2 * group; ++x) head_totals.push_back(unwritten_floats(n));
  }
  Fold& at(std::size_t grad, int b, std::int64_t g, int block) {
    return folds[index.at({grad, b, g, block})];
  }
  /// The lane totals of query CP rank r in fold f, allocated on first use.
  std::size_t lane_of(Fold& f, int r, int group, int dim) {
    std::size_t& first = f.first_lane[static_cast<std::size_t>(r)];
    if (first == kNone) {
      first = lane_totals.size();
      const std::size_t n = static_cast<std::size_t>(f.block.range.size()) * dim;
      // Written whole by the rank's first block (lane_first).
      for (int x = 0; x < 2 * group; ++x) lane_totals.push_back(unwritten_floats(n));
    }
    return first;
  }
};

/// dK, dV: the GQA group's heads folded in ascending order; dK carries the scale. With the
/// te_p2p lane, its dK, dV too: per query CP rank in the order the travelling dK/dV visits them
/// (te_backward_dkv_visitor: s−1, s−2, …, s; ranks whose queries never saw the block skipped),
/// its pair's GQA-folded sums (dK scaled) rounded to BF16, summed in BF16. A fold (one KV block
/// of one KV head) a task on the pool.
void fold_kv_gradients(const CaseGrid& grid, const KvTotals& totals, ThreadPool& pool,
                       std::vector<RankGradients>& grads);

/// The round's partial dq to the query owners, folded there in block order (and the te_p2p
/// lane's alike). Each query block's fold is a task on the pool: they write apart.
void fold_dq(const CaseGrid& grid, const Range& span, std::vector<Message> partials,
             const std::vector<LogicalRank>& hosted, Transport& transport, ThreadPool& pool,
             std::vector<RankGradients>& grads);

}  // namespace cpd::backward_folds
