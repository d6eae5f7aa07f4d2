#include "engine/manifest.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "core/errors.h"

namespace cpd {
namespace {

// The longest of the ranks' query ranges.
std::int64_t longest_range(const std::vector<LogicalRank>& ranks) {
  std::int64_t longest = 0;
  for (const LogicalRank& r : ranks) {
    for (const Range& t : r.tokens) longest = std::max(longest, t.size());
  }
  return longest;
}

// The fields every message has: who, to whom, which rows of which heads, and a payload of
// `floats_per_row` floats per (batch, head, token).
MessageHeader rows_header(const CaseGrid& grid, MessageKind kind, const LogicalRank& src,
                          const LogicalRank& dst, const Range& tokens, const Range& heads,
                          std::int64_t floats_per_row) {
  MessageHeader h;
  h.kind = kind;
  h.src = src.id;
  h.dst = dst.id;
  h.token_begin = tokens.begin;
  h.token_end = tokens.end;
  h.head_begin = static_cast<std::int32_t>(heads.begin);
  h.head_end = static_cast<std::int32_t>(heads.end);
  h.batch = grid.problem.batch;
  h.width = grid.problem.dims.head_dim;
  h.floats = static_cast<std::int64_t>(h.batch) * heads.size() * tokens.size() * floats_per_row;
  return h;
}

// Header of the query rows `tokens` of rank `src` sent to rank `dst`.
MessageHeader q_shard_header(const CaseGrid& grid, const LogicalRank& src, const LogicalRank& dst,
                             const Range& tokens) {
  return rows_header(grid, MessageKind::q_shard, src, dst, tokens, src.q_heads,
                     grid.problem.dims.head_dim);
}

// Header of the K and V rows of `tokens` (one of `src`'s ranges) sent by `src` to `dst`.
MessageHeader kv_shard_header(const CaseGrid& grid, const LogicalRank& src, const LogicalRank& dst,
                              const Range& tokens) {
  // K then V rows.
  return rows_header(grid, MessageKind::kv_shard, src, dst, tokens, src.kv_heads,
                     2LL * grid.problem.dims.head_dim);
}

// Header of the CP=1 reference forward rows `tokens` of KV head `g`'s group, from their owner
// `src` to `dst`, the CP rank that computes the group's reference backward.
MessageHeader reference_forward_header(const CaseGrid& grid, const LogicalRank& src,
                                       const LogicalRank& dst, const Range& tokens,
                                       std::int64_t g) {
  // out of the group's query heads, then their lse: group · (D + 1) floats per (batch, token).
  const std::int64_t group = grid.problem.dims.group_size();
  return rows_header(grid, MessageKind::reference_forward, src, dst, tokens, Range{g, g + 1},
                     group * (grid.problem.dims.head_dim + 1));
}

// A per-KV-block message to query owner `dst` from the block's owner: `floats` per row.
MessageHeader block_header(const CaseGrid& grid, MessageKind kind, const LogicalRank& dst,
                           const Range& tokens, const KvBlock& block, std::int64_t floats) {
  MessageHeader h = rows_header(grid, kind, grid.at(dst.tp_rank, block.owner_cp_rank), dst, tokens,
                                dst.q_heads, floats);
  h.block_index = block.index;
  h.block_begin = block.range.begin;
  h.block_end = block.range.end;
  return h;
}

// The per-block messages `kind` (`floats` per row) `dst` receives: for the part `part(range)`
// of each of its token ranges (none when empty), one per causally visible block.
template <class Part>
std::vector<MessageHeader> per_block(const CaseGrid& grid, MessageKind kind, const LogicalRank& dst,
                                     std::int64_t floats, Part&& part) {
  std::vector<MessageHeader> out;
  for (const Range& range : dst.tokens) {
    const Range rows = part(range);
    if (rows.empty()) continue;
    for (const KvBlock& block : grid.blocks) {
      if (causally_visible(block.range, rows))
        out.push_back(block_header(grid, kind, dst, rows, block, floats));
    }
  }
  return out;
}

// The query rows of the other CP ranks (same TP rank as dst) inside `span` that one of dst's
// KV blocks sees: (their owner, the rows), one per owner's range.
std::vector<std::pair<const LogicalRank*, Range>> rows_seen_by(const CaseGrid& grid,
                                                               const LogicalRank& dst,
                                                               const Range& span) {
  std::vector<std::pair<const LogicalRank*, Range>> out;
  const std::vector<KvBlock> mine = grid.blocks_of(dst.cp_rank);
  for (int r = 0; r < grid.spec.cp; ++r) {
    if (r == dst.cp_rank) continue;
    const LogicalRank& src = grid.at(dst.tp_rank, r);
    for (const Range& tokens : src.tokens) {
      const Range part = intersection(tokens, span);
      const bool seen =
          !part.empty() && std::any_of(mine.begin(), mine.end(), [&](const KvBlock& b) {
            return causally_visible(b.range, part);
          });
      if (seen) out.emplace_back(&src, part);
    }
  }
  return out;
}

// KV heads of a TP group per CP rank in the shared reference.
std::int64_t reference_block(const CaseGrid& grid) {
  const std::int64_t kv = grid.problem.dims.num_kv_heads / grid.spec.tp;
  return (kv + grid.spec.cp - 1) / grid.spec.cp;
}

}  // namespace

CaseGrid::CaseGrid(const Problem& p, const CaseSpec& s, std::int64_t rows)
    : problem(p), spec(s), blocks(kv_block_grid(s, p.seq_len)), round_rows(rows) {
  for (int id = 0; id < s.num_logical_ranks(); ++id) ranks.push_back(logical_rank(s, p, id));
  if (round_rows <= 0) {
    // A row's states against every block: out and lse of each of the rank's query heads.
    const std::int64_t heads = p.dims.num_q_heads / s.tp;
    const std::int64_t row_bytes = static_cast<std::int64_t>(blocks.size()) * p.batch * heads *
                                   (p.dims.head_dim + 1) * std::int64_t{sizeof(float)};
    round_rows = std::max<std::int64_t>(16, kRoundStateBytes / row_bytes / 16 * 16);
  }
  round_rows = std::min(round_rows, std::max<std::int64_t>(1, longest_range(ranks)));
}

int CaseGrid::rounds() const {
  return static_cast<int>((longest_range(ranks) + round_rows - 1) / round_rows);
}

std::vector<Range> CaseGrid::backward_rounds() const {
  std::vector<Range> spans;
  for (const KvBlock& b : blocks) {
    if (!spans.empty() && b.range.end - spans.back().begin <= round_rows) {
      spans.back().end = b.range.end;
    } else {
      spans.push_back(b.range);
    }
  }
  return spans;
}

Range CaseGrid::round_group(const Range& tokens, int round) const {
  const std::int64_t begin = tokens.begin + std::int64_t{round} * round_rows;
  if (begin >= tokens.end) return Range{tokens.end, tokens.end};
  return Range{begin, std::min(tokens.end, begin + round_rows)};
}

std::vector<KvBlock> CaseGrid::blocks_of(int cp_rank) const {
  std::vector<KvBlock> owned;
  for (const KvBlock& b : blocks) {
    if (b.owner_cp_rank == cp_rank) owned.push_back(b);
  }
  return owned;
}

Inbox::SlotKey Inbox::key_of(const MessageHeader& h) {
  return SlotKey{
      static_cast<int>(h.kind), h.dst, h.block_index, h.token_begin, h.token_end, h.head_begin};
}

Inbox::Inbox(std::vector<MessageHeader> expected)
    : expected_(std::move(expected)), slots_(expected_.size()), filled_(expected_.size(), false) {
  for (std::size_t i = 0; i < expected_.size(); ++i) index_.emplace(key_of(expected_[i]), i);
}

void Inbox::accept(Message message) {
  const MessageHeader& h = message.header;
  const auto found = index_.find(key_of(h));
  if (found == index_.end()) throw ProtocolError("unexpected " + describe(h));
  const std::size_t slot = found->second;
  const MessageHeader* it = &expected_[slot];
  if (filled_[slot]) throw ProtocolError("duplicated " + describe(h));
  if (*it != h || static_cast<std::int64_t>(message.payload.size()) != it->floats) {
    throw ProtocolError("mis-shaped " + describe(h) + ": expected " + describe(*it) + " with " +
                        std::to_string(it->floats) + " floats, got " +
                        std::to_string(message.payload.size()));
  }
  filled_[slot] = true;
  slots_[slot] = std::move(message);
  arrival_.push_back(slot);
}

void Inbox::require_complete() const {
  for (std::size_t i = 0; i < expected_.size(); ++i) {
    if (!filled_[i]) throw ProtocolError("missing " + describe(expected_[i]));
  }
}

MessageHeader state_header(const CaseGrid& grid, const LogicalRank& dst, const Range& tokens,
                           const KvBlock& block) {
  // out (head_dim floats) and lse (one) per row.
  return block_header(grid, MessageKind::partial_state, dst, tokens, block,
                      grid.problem.dims.head_dim + 1);
}

std::vector<MessageHeader> expected_states(const CaseGrid& grid, const LogicalRank& dst,
                                           int round) {
  return per_block(grid, MessageKind::partial_state, dst, grid.problem.dims.head_dim + 1,
                   [&](const Range& range) { return grid.round_group(range, round); });
}

std::vector<MessageHeader> expected_q_shards(const CaseGrid& grid, const LogicalRank& dst) {
  std::vector<MessageHeader> out;
  for (const auto& [src, rows] : rows_seen_by(grid, dst, Range{0, grid.problem.seq_len}))
    out.push_back(q_shard_header(grid, *src, dst, rows));
  return out;
}

std::vector<MessageHeader> expected_backward_rows(const CaseGrid& grid, const LogicalRank& dst,
                                                  const Range& span) {
  std::vector<MessageHeader> out;
  for (const auto& [src, rows] : rows_seen_by(grid, dst, span)) {
    out.push_back(rows_header(grid, MessageKind::backward_rows, *src, dst, rows, src->q_heads,
                              2LL * grid.problem.dims.head_dim + 2));
  }
  return out;
}

MessageHeader dq_partial_header(const CaseGrid& grid, const LogicalRank& dst, const Range& tokens,
                                const KvBlock& block) {
  return block_header(grid, MessageKind::dq_partial, dst, tokens, block,
                      grid.problem.dims.head_dim);
}

std::vector<MessageHeader> expected_dq_partials(const CaseGrid& grid, const LogicalRank& dst,
                                                const Range& span) {
  return per_block(grid, MessageKind::dq_partial, dst, grid.problem.dims.head_dim,
                   [&](const Range& tokens) { return intersection(tokens, span); });
}

std::vector<Range> chain_chunks(const TpChain& chain, const LogicalRank& r) {
  std::vector<Range> out;
  for (const Range& t : r.tokens) {
    for (std::int64_t b = t.begin; b < t.end; b += chain.chunk_rows)
      out.push_back(Range{b, std::min(t.end, b + chain.chunk_rows)});
  }
  return out;
}

int chain_steps(const CaseGrid& grid, const TpChain& chain) {
  std::size_t chunks = 0;
  for (const LogicalRank& r : grid.ranks) chunks = std::max(chunks, chain_chunks(chain, r).size());
  return static_cast<int>(chunks) + grid.spec.tp - 1;
}

std::vector<MessageHeader> expected_chain_partials(const CaseGrid& grid, const TpChain& chain,
                                                   const LogicalRank& dst, int step) {
  const int tp = grid.spec.tp;
  if (tp == 1) return {};
  const LogicalRank& src = grid.at((dst.tp_rank + tp - 1) % tp, dst.cp_rank);
  const std::vector<Range> chunks = chain_chunks(chain, src);
  const int chunk = step - src.tp_rank;
  if (chunk < 0 || chunk >= static_cast<int>(chunks.size())) return {};
  // The plane folds the heads from the owner's first through the sender's last, and the
  // sender's first is the one after the plane's heads before it: the chain follows the heads in
  // ascending order only because TP rank t holds the t-th range of them.
  const LogicalRank& owner = grid.at(0, dst.cp_rank);
  if (src.tp_rank > 0 && grid.at(src.tp_rank - 1, src.cp_rank).q_heads.end != src.q_heads.begin)
    throw std::logic_error("TP chain: the TP ranks' heads do not follow one another");
  const Range& tokens = chunks[static_cast<std::size_t>(chunk)];
  MessageHeader h = rows_header(grid, chain.kind, src, dst, tokens,
                                Range{owner.q_heads.begin, src.q_heads.end}, 2 * chain.width);
  h.width = static_cast<std::int32_t>(chain.width);
  h.floats = chain.planes * grid.problem.batch * tokens.size() * chain.width;  // every head
  return {h};
}

std::int64_t logit_chunk_rows(const CaseGrid& grid, int vocab) {
  const Problem& p = grid.problem;
  const std::uint64_t per_row = 2ULL * static_cast<std::uint64_t>(p.batch) *
                                static_cast<std::uint64_t>(p.dims.num_q_heads / grid.spec.tp) *
                                static_cast<std::uint64_t>(vocab) * sizeof(float);
  // At least one CPU projection tile of rows (16: one SIMD lane a row), which a large
  // vocabulary's budget alone would leave mostly empty.
  return std::max<std::int64_t>(kLogitChunkMinRows,
                                static_cast<std::int64_t>(kLogitChunkBytes / per_row));
}

TpChain logit_chain(const CaseGrid& grid, int vocab) {
  return TpChain{MessageKind::logit_partial, vocab, logit_chunk_rows(grid, vocab)};
}

std::vector<Range> logit_chunks(const CaseGrid& grid, const LogicalRank& r, int vocab) {
  return chain_chunks(logit_chain(grid, vocab), r);
}

std::int64_t largest_logit_chunk(const CaseGrid& grid, const LogicalRank& r, int vocab) {
  return std::min(logit_chunk_rows(grid, vocab), longest_range({r}));
}

int logit_steps(const CaseGrid& grid, int vocab) {
  return dlogp_steps(grid, vocab) - (grid.spec.tp - 1);
}

int dlogp_steps(const CaseGrid& grid, int vocab) {
  return chain_steps(grid, logit_chain(grid, vocab));
}

TpChain layer_chain(const CaseGrid& grid) {
  return TpChain{MessageKind::layer_partial, grid.problem.dims.hidden_size, kLayerChunkRows,
                 grid.problem.reduction_lanes ? 2 + grid.spec.tp : 2};
}

Range vocab_shard(int vocab, int tp, int tp_rank) {
  const std::int64_t blocks = (vocab + kVocabBlock - 1) / kVocabBlock;
  const auto edge = [&](int t) {
    return std::min<std::int64_t>(vocab, blocks * t / tp * kVocabBlock);
  };
  return Range{edge(tp_rank), edge(tp_rank + 1)};
}

TpChain layer_logit_chain(const CaseGrid& grid, int vocab) {
  const std::uint64_t per_row = 2ULL * static_cast<std::uint64_t>(grid.problem.batch) *
                                static_cast<std::uint64_t>(vocab) * sizeof(float);
  return TpChain{MessageKind::vocab_logits, vocab,
                 std::max<std::int64_t>(kLogitChunkMinRows,
                                        static_cast<std::int64_t>(kLogitChunkBytes / per_row))};
}

int layer_dlogp_steps(const CaseGrid& grid, int vocab) {
  return 2 * (chain_steps(grid, layer_logit_chain(grid, vocab)) - (grid.spec.tp - 1));
}

std::vector<MessageHeader> expected_layer_logits(const CaseGrid& grid, const LogicalRank& dst,
                                                 int vocab, int step) {
  const int tp = grid.spec.tp;
  if (tp == 1) return {};
  const TpChain chain = layer_logit_chain(grid, vocab);
  const LogicalRank& owner = grid.at(0, dst.cp_rank);
  const std::vector<Range> chunks = chain_chunks(chain, owner);
  const std::size_t chunk = static_cast<std::size_t>(step / 2);
  if (chunk >= chunks.size()) return {};
  const Range& tokens = chunks[chunk];
  const std::int64_t hidden = grid.problem.dims.hidden_size;
  std::vector<MessageHeader> out;
  const auto header = [&](MessageKind kind, const LogicalRank& src, const Range& range,
                          std::int64_t width) {
    MessageHeader h = rows_header(grid, kind, src, dst, tokens, range, 2 * width);
    h.width = static_cast<std::int32_t>(width);
    h.floats = 2LL * grid.problem.batch * tokens.size() * width;
    return h;
  };
  if (step % 2 == 0) {  // the owner's rows to each other TP rank
    if (dst.tp_rank > 0) out.push_back(header(MessageKind::layer_rows, owner, Range{0, 1}, hidden));
  } else if (dst.tp_rank == 0) {  // each other TP rank's logits to the owner, in TP order
    for (int t = 1; t < tp; ++t) {
      const Range range = vocab_shard(vocab, tp, t);
      out.push_back(
          header(MessageKind::vocab_logits, grid.at(t, dst.cp_rank), range, range.size()));
    }
  }
  return out;
}

std::vector<MessageHeader> expected_kv_allgather(const CaseGrid& grid, const LogicalRank& dst) {
  std::vector<MessageHeader> out;
  for (int r = 0; r < grid.spec.cp; ++r) {
    if (r == dst.cp_rank) continue;
    const LogicalRank& src = grid.at(dst.tp_rank, r);
    for (const Range& kv : src.tokens) {
      const bool needed = std::any_of(dst.tokens.begin(), dst.tokens.end(),
                                      [&](const Range& q) { return causally_visible(kv, q); });
      if (needed) out.push_back(kv_shard_header(grid, src, dst, kv));
    }
  }
  return out;
}

std::vector<MessageHeader> expected_kv_ring(const CaseGrid& grid, const LogicalRank& dst,
                                            int step) {
  const int cp = grid.spec.cp;
  const LogicalRank& origin = grid.at(dst.tp_rank, ((dst.cp_rank - step) % cp + cp) % cp);
  const LogicalRank& previous = grid.at(dst.tp_rank, (dst.cp_rank - 1 + cp) % cp);
  std::vector<MessageHeader> out;
  for (const Range& kv : origin.tokens) out.push_back(kv_shard_header(grid, previous, dst, kv));
  return out;
}

int reference_rounds(const CaseGrid& grid, int per_round) {
  return static_cast<int>((reference_block(grid) + per_round - 1) / per_round);
}

Range reference_kv_heads(const CaseGrid& grid, const LogicalRank& r, int round, int per_round) {
  const std::int64_t block = reference_block(grid);
  const std::int64_t first = r.kv_heads.begin + r.cp_rank * block;
  const std::int64_t end = std::min(first + block, r.kv_heads.end);
  const std::int64_t begin = first + std::int64_t{round} * per_round;
  return Range{std::min(begin, end), std::min(begin + per_round, end)};
}

MessageHeader reference_grads_header(const CaseGrid& grid, const LogicalRank& src,
                                     const LogicalRank& dst, const Range& tokens, std::int64_t g) {
  // dq of the group's query heads, dk and dv: (group + 2) rows of head_dim per (batch, token).
  const std::int64_t group = grid.problem.dims.group_size();
  return rows_header(grid, MessageKind::reference_grads, src, dst, tokens, Range{g, g + 1},
                     (group + 2) * grid.problem.dims.head_dim);
}

std::vector<MessageHeader> expected_reference_forward(const CaseGrid& grid, const LogicalRank& dst,
                                                      int round, int per_round) {
  std::vector<MessageHeader> out;
  const Range heads = reference_kv_heads(grid, dst, round, per_round);
  for (std::int64_t g = heads.begin; g < heads.end; ++g) {
    for (int c = 0; c < grid.spec.cp; ++c) {
      const LogicalRank& src = grid.at(dst.tp_rank, c);
      for (const Range& t : src.tokens)
        out.push_back(reference_forward_header(grid, src, dst, t, g));
    }
  }
  return out;
}

std::vector<MessageHeader> expected_reference_grads(const CaseGrid& grid, const LogicalRank& dst,
                                                    int round, int per_round) {
  std::vector<MessageHeader> out;
  for (int c = 0; c < grid.spec.cp; ++c) {
    const LogicalRank& src = grid.at(dst.tp_rank, c);
    const Range heads = reference_kv_heads(grid, src, round, per_round);
    for (std::int64_t g = heads.begin; g < heads.end; ++g) {
      for (const Range& t : dst.tokens) out.push_back(reference_grads_header(grid, src, dst, t, g));
    }
  }
  return out;
}

}  // namespace cpd
