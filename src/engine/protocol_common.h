// Pieces every CP protocol is built from: the hosted ranks' inputs, query and K/V rows as
// messages, partial-state computation, validated delivery, and the ordered merge.
#pragma once

#include <functional>
#include <map>
#include <vector>

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

/// The K then V rows of `tokens`, as a message payload.
FloatBuffer kv_payload(const Shard& k, const Shard& v, const Range& tokens, ThreadPool& pool);

/// What a hosted rank's manifest lists for one superstep (expected_states, …).
using Manifest = std::function<std::vector<MessageHeader>(const LogicalRank&)>;

/// One superstep: `outgoing` leaves, and what reaches each hosted rank is checked into its
/// inbox against `expected` (the manifest); then all processes agree, so a bad message fails
/// every rank with the same ProtocolError (never a hang, never a partial merge).
std::map<int, Inbox> superstep(Transport& transport, const std::vector<LogicalRank>& hosted,
                               std::vector<Message> outgoing, const Manifest& expected);

/// The superstep of every message `expected` lists for any rank whose source is hosted here,
/// each with the payload `payload(header)`.
std::map<int, Inbox> exchange(const CaseGrid& grid, Transport& transport,
                              const std::vector<LogicalRank>& hosted, const Manifest& expected,
                              const std::function<FloatBuffer(const MessageHeader&)>& payload);

/// Query rows whose states are computed here — one of the owner's token ranges, the row of
/// (batch b, owner's head h, token tokens.begin + i) at rows + ((b·heads + h)·tokens.size() + i)·D
/// — and the K/V (one or more of a rank's token ranges) whose blocks they are computed against.
struct StateWork {
  const LogicalRank* owner;
  Range tokens;
  const float* rows;
  const Shard* k;
  const Shard* v;
};

/// The rounds of a protocol: round i computes the states of the i-th row group of every
/// `work` query against every block its K/V hold that the group sees, moves them to the query
/// owners (ag_rs: over the transport; the other protocols compute them where they merge, and
/// check them alike), checks them against the manifest and merges them in global block order.
/// Collective.
std::vector<RankOutput> state_rounds(const CaseGrid& grid, const PathSpec& path,
                                     Transport& transport, InputStore& store,
                                     const std::vector<LogicalRank>& hosted,
                                     const std::vector<StateWork>& work, MergeExtras extras);

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
/// ring_kv and allgather_kv.
std::vector<RankOutput> run_kv_protocol(const CaseGrid& grid, const PathSpec& path,
                                        Transport& transport, InputStore& store,
                                        MergeExtras extras);

}  // namespace cpd::protocol
