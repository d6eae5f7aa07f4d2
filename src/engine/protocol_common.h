// Pieces every CP protocol is built from: the hosted ranks' inputs, query and K/V rows as
// messages, partial-state computation, validated delivery, and the ordered merge.
#pragma once

#include <map>
#include <vector>

#include "core/util/work_timers.h"
#include "engine/protocol.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/attention.h"

namespace cpd::protocol {

/// A hosted rank's own query, key and value shards, in the path's precision.
struct RankInputs {
  Shard q, k, v;
};
std::map<int, RankInputs> generate_inputs(const CaseGrid& grid,
                                          const std::vector<LogicalRank>& hosted,
                                          const PathSpec& path, InputStore& store);

/// Rows `tokens` of a shard for every (batch, head): the layout [B][heads][rows][width]. The
/// (batch, head) pieces are copied across the pool.
FloatBuffer rows_of(const Shard& shard, const Range& tokens, ThreadPool& pool);

/// Whether `protocol` computes a hosted rank's states from its own query shard in place: ag_rs
/// does when the shard is one range, already a piece's layout; a zigzag shard's ranges, and the
/// other protocols' pieces, are copies. The memory plan counts the copy by the same rule.
inline bool serves_own_rows_in_place(Protocol protocol, const LogicalRank& rank) {
  return protocol == Protocol::ag_rs && rank.tokens.size() == 1;
}

/// Query rows somebody computes states for: their owner, their tokens, and where their rows
/// are: the row of (batch b, owner's head h, token tokens.begin + i) at
/// rows + ((b·heads + h)·row_stride + i)·D — a whole range ([B][heads][tokens][D], row_stride =
/// tokens.size()) or one round's group of it.
struct QueryPiece {
  const LogicalRank* owner;
  Range tokens;
  const float* rows;
  std::int64_t row_stride;

  /// A whole range's rows.
  static QueryPiece range(const LogicalRank* owner, Range tokens, const float* rows) {
    return QueryPiece{owner, tokens, rows, tokens.size()};
  }
  /// The rows of `group` (within tokens) of this piece.
  QueryPiece group(Range g, int dim) const {
    return QueryPiece{owner, g, rows + (g.begin - tokens.begin) * dim, row_stride};
  }
};

/// K and V rows of one or more token ranges of the owner's KV heads.
struct KvPiece {
  Shard k, v;
};
/// A K/V message's payload as a piece (K rows, then V rows).
KvPiece kv_piece_of(const Message& m, const CaseGrid& grid);

/// K and V rows a rank reads, held elsewhere (its own shards, or a piece that arrived).
struct KvView {
  const Shard* k;
  const Shard* v;
};
/// The K then V rows of `tokens`, as a message payload.
FloatBuffer kv_payload(const Shard& k, const Shard& v, const Range& tokens, ThreadPool& pool);

/// The payload buffers of one round's merged states, handed to the next round's states (whose
/// shapes repeat round after round), so a state's pages are written by its kernel, not cleared
/// before it. Lives as long as one path's rounds and keeps no more buffers than the last round
/// made here, so a round holds no more memory than without it.
class PayloadPool {
 public:
  /// A buffer of `floats` floats, contents unspecified (the smallest spare that is large
  /// enough; else the largest, grown).
  FloatBuffer take(std::size_t floats);
  /// The payloads of the inboxes' messages (the inboxes are empty after), keeping the largest
  /// `made` of the spares: the number of buffers this process took for the round.
  void give_back(std::map<int, Inbox>& inboxes, std::size_t made);

 private:
  std::multimap<std::size_t, FloatBuffer> spare_;  // by size
};

/// The partial state of `query` against `block` (whose K/V rows `k`, `v` hold) as a message to
/// the query's owner, its payload from `pool`; the jobs that fill it (every float) are appended
/// to `jobs` (run them before the payload is read). Messages can be moved freely: jobs point
/// into the payload buffer.
Message state_message(const CaseGrid& grid, const QueryPiece& query, const KvBlock& block,
                      const Shard& k, const Shard& v, std::vector<BlockJob>& jobs,
                      PayloadPool& pool);

/// States of round `round`'s group of a query owner's own ranges (`own_rows[i]`: range i's rows)
/// against every block of `k`/`v` they can see (ring_kv, allgather_kv: the owner computes them).
void own_states(const CaseGrid& grid, const LogicalRank& owner, const FloatBuffer* own_rows,
                const Shard& k, const Shard& v, int round, std::vector<Message>& states,
                std::vector<BlockJob>& jobs, PayloadPool& pool);

/// Partial states of `jobs` with the path's kernel.
void run_state_jobs(const CaseGrid& grid, const PathSpec& path, std::span<const BlockJob> jobs,
                    AttentionBackend& backend);

/// Completes the superstep in flight, routes what arrived into the inboxes of their
/// destinations and checks every inbox is complete; then all processes agree, so a bad
/// message fails every rank with the same ProtocolError (never a hang, never a partial merge).
void deliver(Transport& transport, std::map<int, Inbox>& inboxes);

/// The same checks for states this process computed itself (ring_kv, allgather_kv).
void check_local(Transport& transport, std::vector<Message> states, std::map<int, Inbox>& inboxes);

/// Inboxes for the given hosted ranks, from a manifest function.
template <class ExpectedFn>
std::map<int, Inbox> inboxes_for(const std::vector<LogicalRank>& hosted, ExpectedFn&& expected) {
  std::map<int, Inbox> boxes;
  for (const LogicalRank& r : hosted) boxes.emplace(r.id, Inbox(expected(r)));
  return boxes;
}

/// One superstep: `outgoing` leaves, and what reaches each hosted rank is checked into its
/// inbox against `expected` (the manifest; built before the messages move).
template <class ExpectedFn>
std::map<int, Inbox> superstep(Transport& transport, const std::vector<LogicalRank>& hosted,
                               std::vector<Message> outgoing, ExpectedFn&& expected) {
  const WorkTimer t(WorkKind::messages);
  std::map<int, Inbox> inboxes = inboxes_for(hosted, expected);
  transport.start(std::move(outgoing));
  deliver(transport, inboxes);
  return inboxes;
}

/// The hosted ranks' outputs before the first round: rows unwritten, which the rounds' merges
/// write (and checks and lanes when asked).
std::vector<RankOutput> start_outputs(const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
                                      MergeExtras extras);

/// Round `round` of every hosted rank (outputs[i] is hosted[i]'s): its validated states merged
/// in global block order into its rows of the round; when the outputs carry checks, the merge
/// checks of those rows and the states' headers. The store's backend merges; its pool runs the
/// host-side work.
void merge_round(const CaseGrid& grid, int round, const std::vector<LogicalRank>& hosted,
                 std::map<int, Inbox>& inboxes, InputStore& store,
                 std::vector<RankOutput>& outputs);

/// The rounds of a protocol whose query owners compute their own states (ring_kv,
/// allgather_kv): each round, every hosted rank's group rows (`own_rows[id][i]`: its range i)
/// against the blocks of every K/V piece it holds (`kv[id]`), checked against the manifest and
/// merged. Collective.
std::vector<RankOutput> local_rounds(const CaseGrid& grid, const PathSpec& path,
                                     Transport& transport, InputStore& store,
                                     const std::vector<LogicalRank>& hosted,
                                     const std::map<int, std::vector<KvView>>& kv,
                                     const std::map<int, std::vector<FloatBuffer>>& own_rows,
                                     MergeExtras extras);

/// Merge jobs for the rows `groups` (the round's groups of a rank's ranges) of a rank's query
/// shard `into` from `states` (taken in `order`, indices into `states`; the merge sorts them by
/// block index anyway).
std::vector<MergeJob> state_merge_jobs(const AttnShard& into, const LogicalRank& r,
                                       const std::vector<Range>& groups,
                                       const std::vector<Message>& states,
                                       const std::vector<std::size_t>& order, int batch, int dim);

/// Rows of a group the production lanes fold at a time (their scratch: CP × B × heads × this
/// many rows of out and lse).
inline constexpr std::int64_t kLaneRows = 64;

/// The production lanes (numerics.md §10) of the rows `groups` of rank `r` from the round's
/// validated `states`: per row, each CP rank's blocks folded in block order (its kernel call),
/// rounded to BF16, then merged as each lane's stack does into `lanes[k]` (kProductionLanes[k]).
/// The (batch, head) rows of the lanes' merges are spread over `pool`.
void merge_production_lanes(const CaseGrid& grid, const LogicalRank& r,
                            const std::vector<Range>& groups, const std::vector<Message>& states,
                            AttentionBackend& backend, ThreadPool& pool,
                            std::vector<AttnShard>& lanes);

std::vector<RankOutput> run_ag_rs(const CaseGrid& grid, const PathSpec& path, Transport& transport,
                                  InputStore& store, MergeExtras extras);
std::vector<RankOutput> run_ring_kv(const CaseGrid& grid, const PathSpec& path,
                                    Transport& transport, InputStore& store, MergeExtras extras);
std::vector<RankOutput> run_allgather_kv(const CaseGrid& grid, const PathSpec& path,
                                         Transport& transport, InputStore& store,
                                         MergeExtras extras);

}  // namespace cpd::protocol
