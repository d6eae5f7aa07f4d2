// The block manifest (design §4): which messages a logical rank must receive in a case,
// computed independently on every rank from the case alone. Receivers check every arrival
// against it; anything missing, duplicated, unexpected or mis-shaped is a ProtocolError.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/message.h"
#include "core/plan.h"

namespace cpd {

/// Whether a KV block holds a key visible to some query in `tokens` (causal): the block
/// pairs this rejects are skipped everywhere, which merges identically (attention_math.h).
inline bool causally_visible(const Range& block, const Range& tokens) {
  return block.begin < tokens.end;
}

/// The budget of one round's partial states per query range (design §4). Rounds are at least 16
/// rows, so past about a hundred KV blocks a round holds more (a row's states against every block).
inline constexpr std::int64_t kRoundStateBytes = std::int64_t{32} << 20;

/// The topology of one case as every rank sees it.
struct CaseGrid {
  Problem problem;
  CaseSpec spec;
  std::vector<KvBlock> blocks;
  std::vector<LogicalRank> ranks;  // by logical id
  /// Query rows per round: each query range is cut into groups of this many rows from its start,
  /// and forward round i exchanges and merges the i-th group of every range, so no process holds
  /// a range's states for every block at once; the backward's rounds are runs of whole query
  /// blocks up to this many positions. The FP32 and emulated-BF16 bits never depend on it
  /// (kernels are row-independent, every fold keeps its order); cuBLAS's unfused GEMMs are
  /// reproducible for a fixed shape only, so theirs can.
  std::int64_t round_rows = 0;

  /// `round_rows` 0: as many rows (a multiple of 16, at least 16) as keep one round's states of
  /// a query range within kRoundStateBytes; never more than the longest range.
  CaseGrid(const Problem& p, const CaseSpec& s, std::int64_t round_rows = 0);
  /// The logical rank with the given TP rank and CP rank.
  const LogicalRank& at(int tp_rank, int cp_rank) const {
    return ranks[cp_rank * spec.tp + tp_rank];
  }
  /// The blocks a CP rank owns, ascending.
  std::vector<KvBlock> blocks_of(int cp_rank) const;
  /// Rounds of the state exchange: enough for the longest query range.
  int rounds() const;
  /// The rows of `tokens` (a query range) round `round` covers; empty past its end.
  Range round_group(const Range& tokens, int round) const;
  /// The rounds of the backward: spans of consecutive blocks of the grid, ascending, each
  /// holding at most round_rows positions (at least one block). dK and dV fold their query blocks
  /// in ascending order across these rounds, the order of the fold without rounds.
  std::vector<Range> backward_rounds() const;
};

/// Validates arrivals of one kind for one destination rank against the manifest.
class Inbox {
 public:
  explicit Inbox(std::vector<MessageHeader> expected);

  /// Takes a message; throws ProtocolError naming the message and both ranks when it is not
  /// in the manifest, arrives twice, or has a header or payload size other than expected.
  void accept(Message message);
  /// Throws ProtocolError naming the first expected message that never arrived.
  void require_complete() const;
  /// The arrived messages, in manifest order (never arrival order).
  const std::vector<Message>& messages() const { return slots_; }
  /// Moves the messages out (their buffers to be reused); messages() is empty after.
  std::vector<Message> take_messages() { return std::exchange(slots_, {}); }
  /// Arrival order, for the merge-order probe.
  const std::vector<std::size_t>& arrival_order() const { return arrival_; }

 private:
  // A message is identified by what it carries (kind, destination, block, token range and, for
  // per-head-range messages from several TP ranks, its first head); the rest of the header
  // must then agree with the manifest.
  using SlotKey =
      std::tuple<int, std::int32_t, std::int32_t, std::int64_t, std::int64_t, std::int32_t>;
  static SlotKey key_of(const MessageHeader& h);

  std::vector<MessageHeader> expected_;
  std::map<SlotKey, std::size_t> index_;
  std::vector<Message> slots_;
  std::vector<bool> filled_;
  std::vector<std::size_t> arrival_;
};

/// Header of the partial state of `dst`'s query rows `tokens` against `block`, computed by the
/// block's owner.
MessageHeader state_header(const CaseGrid& grid, const LogicalRank& dst, const Range& tokens,
                           const KvBlock& block);

/// Every partial state `dst` must receive in round `round`: for the round's group of each of its
/// token ranges, each causally visible block, in (token range, block index) order.
std::vector<MessageHeader> expected_states(const CaseGrid& grid, const LogicalRank& dst, int round);

/// Every query range `dst` must receive to serve its blocks under ag_rs: the token ranges of
/// the other CP ranks (same TP rank) that see at least one of dst's blocks.
std::vector<MessageHeader> expected_q_shards(const CaseGrid& grid, const LogicalRank& dst);

/// allgather_kv: the K/V ranges of the other CP ranks (same TP rank) that hold a key visible
/// to one of dst's query ranges.
std::vector<MessageHeader> expected_kv_allgather(const CaseGrid& grid, const LogicalRank& dst);

/// Backward, the round of `span` (a backward round): the query rows (q, dO, lse, Δ) `dst` must
/// receive to serve its KV blocks — each other CP rank's (same TP rank) range cut to the span,
/// where one of dst's blocks sees it.
std::vector<MessageHeader> expected_backward_rows(const CaseGrid& grid, const LogicalRank& dst,
                                                  const Range& span);

/// Header of the partial dq of `dst`'s query rows `tokens` against `block`.
MessageHeader dq_partial_header(const CaseGrid& grid, const LogicalRank& dst, const Range& tokens,
                                const KvBlock& block);

/// Backward, the round of `span` (a backward round): the partial dq `dst` must receive, one per
/// (part of a token range in the span, causally visible block).
std::vector<MessageHeader> expected_dq_partials(const CaseGrid& grid, const LogicalRank& dst,
                                                const Range& span);

/// The positions of `a` that `b` holds too (empty when none).
inline Range intersection(const Range& a, const Range& b) {
  const Range r{std::max(a.begin, b.begin), std::min(a.end, b.end)};
  return r.empty() ? Range{a.begin, a.begin} : r;
}

/// A fold along the TP ranks of each CP rank (which hold the same tokens), in steps of token
/// chunks: dlogp's logits over the heads, the layer's o_proj over the head groups. In step s, TP
/// rank t continues its chunk s - t with its heads and sends the plane on, to t + 1, or from the
/// last back to the owner (TP rank 0), which finishes it. A plane is [2][B][rows][width]: the
/// candidate's, then the reference's.
struct TpChain {
  MessageKind kind;
  std::int64_t width;       // floats of a plane's row
  std::int64_t chunk_rows;  // rows of a chunk, the same for every rank of the case
  int planes = 2;           // [planes][B][rows][width]: candidate, reference, and any carried
};
/// Each rank's chunks: its token ranges cut into pieces of chunk_rows, in order.
std::vector<Range> chain_chunks(const TpChain& chain, const LogicalRank& r);
/// The steps a chain takes: the most chunks any rank has, + TP − 1.
int chain_steps(const CaseGrid& grid, const TpChain& chain);
/// Step `step`: the plane `dst` must receive at the step's end, folded over the heads from the
/// owner's first through the sender's last: from the TP rank before it in the chain (the last,
/// for the owner), of the chunk that rank worked on. Nothing at TP = 1, nor outside the sender's
/// chunks. heads() names the heads folded into the plane, not a count of planes.
std::vector<MessageHeader> expected_chain_partials(const CaseGrid& grid, const TpChain& chain,
                                                   const LogicalRank& dst, int step);

/// dlogp's chain: chunks such that a step's per-head partial logits (2·B·heads·rows·vocab floats
/// on a rank, where a backend projects the heads apart before folding them; the CPU folds them in
/// its tile) stay within kLogitChunkBytes whatever the vocabulary, or hold kLogitChunkMinRows
/// rows where that is more. The CPU tile streams each head's lm_head once per chunk, so fewer,
/// longer chunks wait less on that stream. Its chunks, the largest of a rank's, the most any rank
/// has, and the steps.
inline constexpr std::uint64_t kLogitChunkBytes = std::uint64_t{64} << 20;
inline constexpr std::int64_t kLogitChunkMinRows = 16;
std::int64_t logit_chunk_rows(const CaseGrid& grid, int vocab);
TpChain logit_chain(const CaseGrid& grid, int vocab);
std::vector<Range> logit_chunks(const CaseGrid& grid, const LogicalRank& r, int vocab);
std::int64_t largest_logit_chunk(const CaseGrid& grid, const LogicalRank& r, int vocab);
int logit_steps(const CaseGrid& grid, int vocab);
int dlogp_steps(const CaseGrid& grid, int vocab);

/// o_proj's chain (the layer): chunks of kLayerChunkRows tokens, a plane [2 + TP][B][rows][hidden]:
/// the canonical fold of the candidate and of the reference, then each TP rank's own partial of
/// the candidate (the TP-reduction lanes' inputs, numerics.md §12; [2] without the lanes).
inline constexpr std::int64_t kLayerChunkRows = 256;
TpChain layer_chain(const CaseGrid& grid);

/// The layer's logprobs: its lm_head sharded by vocabulary across the TP ranks (Megatron's
/// vocab-parallel layout), TP rank t holding a contiguous range of kVocabBlock-entry blocks
/// (vocab_shard). Per chunk of a CP rank's tokens (the chain's chunks, 2·B·rows·V floats of
/// logits within kLogitChunkBytes), two supersteps: the owner sends the chunk's layer output to
/// each other TP rank of its CP rank (layer_rows), and each sends back its range's logits
/// (vocab_logits), which the owner puts in their places of the whole row.
inline constexpr std::int64_t kVocabBlock = 128;
Range vocab_shard(int vocab, int tp, int tp_rank);
TpChain layer_logit_chain(const CaseGrid& grid, int vocab);
/// Two supersteps a chunk: 2 · the most chunks any CP rank has.
int layer_dlogp_steps(const CaseGrid& grid, int vocab);
/// Step `step` (2·chunk: the rows out, 2·chunk + 1: the logits back): what `dst` must receive.
std::vector<MessageHeader> expected_layer_logits(const CaseGrid& grid, const LogicalRank& dst,
                                                 int vocab, int step);

/// The CP=1 reference backward is computed once per TP group: CP rank c takes the contiguous
/// block of ⌈kv / CP⌉ of the group's KV heads starting at kv_heads.begin + c·⌈kv / CP⌉ (the last
/// ranks fewer, or none), `per_round` of them a round. How many rounds that takes, and the KV
/// heads `r` computes in `round` (empty: none). Every process must pass the same `per_round`.
int reference_rounds(const CaseGrid& grid, int per_round);
Range reference_kv_heads(const CaseGrid& grid, const LogicalRank& r, int round, int per_round);

/// Header of the CP=1 reference gradients of KV head `g`'s group for `dst`'s rows `tokens`,
/// computed by `src`.
MessageHeader reference_grads_header(const CaseGrid& grid, const LogicalRank& src,
                                     const LogicalRank& dst, const Range& tokens, std::int64_t g);

/// The CP=1 reference gradients `dst` must receive in round `round`: for each KV head of dst's
/// that round covers, one per token range of dst, from the CP rank that computes it.
std::vector<MessageHeader> expected_reference_grads(const CaseGrid& grid, const LogicalRank& dst,
                                                    int round, int per_round);

/// The CP=1 reference forward rows `dst` must receive before round `round` of its reference
/// backward: for each KV head it computes that round, one per token range of every CP rank
/// of its TP group.
std::vector<MessageHeader> expected_reference_forward(const CaseGrid& grid, const LogicalRank& dst,
                                                      int round, int per_round);

/// ring_kv, step s ≥ 1: the K/V ranges of CP rank (dst - s) mod CP, forwarded by the previous
/// rank on the ring, (dst - 1) mod CP.
std::vector<MessageHeader> expected_kv_ring(const CaseGrid& grid, const LogicalRank& dst, int step);

}  // namespace cpd
