// The weight gradients' fold over tokens (docs/numerics.md §11): the global token-block grid's
// blocks in ascending order, batch-major, the running sum passed from CP rank to CP rank as the
// order visits their tokens, pipelined over pieces of the gradient's output rows. Each TP rank's
// CP ranks run their own chain over the TP rank's shard of the gradient.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "engine/manifest.h"

namespace cpd {

class Transport;

/// A CP rank's consecutive stretch of the order: (sequence, tokens) visits, ascending.
struct TokenStage {
  int cp_rank = 0;
  std::vector<std::pair<int, Range>> visits;
};
/// The order's stages: every sequence's positions ascending, sequence 0 first, cut where the
/// owning CP rank changes (a rank's adjacent ranges and a sequence's last range followed by the
/// next one's first, on the same rank, are one stage). One stage at CP = 1.
std::vector<TokenStage> token_stages(const CaseGrid& grid);

/// A chain: the running sums of an [outputs][inputs] gradient, candidate and reference, in pieces
/// of `piece_rows` outputs. In step s, stage k folds its blocks into piece s − k and sends it to
/// stage k + 1's rank (same TP rank); the last stage's rank keeps the finished piece.
struct TokenChain {
  std::int64_t outputs = 0, inputs = 0, piece_rows = 0;
  /// The control (--o-proj-order rank_sums): each stage folds its own blocks from zero and adds
  /// its sum to the piece it received, a reduce of per-rank partials.
  bool rank_sums = false;
  /// A piece's planes: candidate and reference, then (2 + CP for the layer's chains) each CP
  /// rank's own partial of the candidate — the gradient reduce-scatter lanes' inputs
  /// (numerics.md §12).
  int planes = 2;
};
std::vector<Range> token_pieces(const TokenChain& chain);
int token_chain_steps(const CaseGrid& grid, const TokenChain& chain);
/// Step `step`: the pieces `dst` must receive at its end, each for one of its stages from the
/// stage before (token_partial; block_index the receiving stage).
std::vector<MessageHeader> expected_token_partials(const CaseGrid& grid, const TokenChain& chain,
                                                   const LogicalRank& dst, int step);
/// The CP rank that holds the finished gradient: the last stage's.
int token_chain_holder(const CaseGrid& grid);

/// `fold(i, stage, piece, plane, first, own, own_continues)`: hosted rank i folds its stage's
/// blocks into `plane` ([2][piece rows][inputs]); `first`: the chain's first stage, whose first
/// block is stored. With planes > 2 also the candidate's alone into `own` (its CP rank's
/// partial, [piece rows][inputs]), continued when the rank had a stage before (`own_continues`);
/// null when the chain copies it (the first stage's).
using TokenFold =
    std::function<void(std::size_t, const TokenStage&, const Range&, float*, bool, float*, bool)>;
/// `finish(i, piece, plane)`: the holder, hosted rank i, with a finished piece.
using TokenFinish = std::function<void(std::size_t, const Range&, const FloatBuffer&)>;

/// Runs the chain for the hosted ranks (every TP rank's at once). Collective over the run's
/// processes; every message is checked against the manifest.
void run_token_chain(const CaseGrid& grid, const TokenChain& chain, Transport& transport,
                     const std::vector<LogicalRank>& hosted, const TokenFold& fold,
                     const TokenFinish& finish);

}  // namespace cpd
