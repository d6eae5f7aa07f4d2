// The protocols whose query owners compute all their states themselves, from the K/V that
// reach them, so states never travel; they are computed and merged one round's row groups at
// a time, from the K/V shards (linear in S) the owner keeps instead of the states (S² / split).
// ring_kv: the K/V shards travel round the CP ring (CP−1 steps, Transformer Engine's p2p
// pattern), each rank keeping every shard it has held; the transfers no longer overlap the
// compute. allgather_kv: every rank gathers the K/V its queries can see in one step (Llama-3
// style).
#include <cstring>
#include <stdexcept>

#include "engine/protocol_common.h"

namespace cpd::protocol {
namespace {

// K and V rows of one or more token ranges of the owner's KV heads.
struct KvPiece {
  Shard k, v;
};

// A K/V message's payload as a piece (K rows, then V rows).
KvPiece kv_piece_of(const Message& m, const CaseGrid& grid) {
  const ShardShape shape{grid.problem.batch, m.header.heads(), {m.header.tokens()}, m.header.width};
  KvPiece piece{Shard(shape, Uninitialized{}), Shard(shape, Uninitialized{})};  // copied whole
  const std::size_t half = shape.size();
  std::memcpy(piece.k.data.data(), m.payload.data(), half * sizeof(float));
  std::memcpy(piece.v.data.data(), m.payload.data() + half, half * sizeof(float));
  return piece;
}

}  // namespace

std::vector<RankOutput> run_kv_protocol(const CaseGrid& grid, const PathSpec& path,
                                        Transport& transport, InputStore& store,
                                        MergeExtras extras) {
  const bool ring = grid.spec.protocol == Protocol::ring_kv;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  std::map<int, RankInputs> inputs = generate_inputs(grid, hosted, path, store);
  // Every K/V shard each hosted rank holds: its own, then those that arrived, in order.
  std::map<int, std::vector<KvPiece>> held;
  for (const LogicalRank& r : hosted) {
    RankInputs& in = inputs.at(r.id);
    held[r.id].push_back(KvPiece{std::move(in.k), std::move(in.v)});
  }
  // A K/V message's rows, from the shard its sender holds them in.
  const auto payload = [&](const MessageHeader& h) {
    for (const KvPiece& piece : held.at(h.src)) {
      for (const Range& t : piece.k.shape.tokens) {
        if (t.contains(h.tokens())) return kv_payload(piece.k, piece.v, h.tokens(), store.pool());
      }
    }
    throw std::logic_error("no K/V rows for " + describe(h));
  };
  for (int step = 1; step <= (ring ? grid.spec.cp - 1 : 1); ++step) {
    const Manifest expected = [&](const LogicalRank& r) {
      return ring ? expected_kv_ring(grid, r, step) : expected_kv_allgather(grid, r);
    };
    const std::map<int, Inbox> arrived = exchange(grid, transport, hosted, expected, payload);
    for (const LogicalRank& r : hosted) {
      for (const Message& m : arrived.at(r.id).messages())
        held.at(r.id).push_back(kv_piece_of(m, grid));
    }
  }
  // Each hosted rank's own query ranges against every shard it holds.
  std::map<int, std::vector<FloatBuffer>> own_rows;
  std::vector<StateWork> work;
  for (const LogicalRank& r : hosted) {
    std::vector<FloatBuffer>& rows = own_rows[r.id];
    for (const Range& t : r.tokens) rows.push_back(rows_of(inputs.at(r.id).q, t, store.pool()));
    for (const KvPiece& piece : held.at(r.id)) {
      for (std::size_t i = 0; i < r.tokens.size(); ++i) {
        work.push_back(StateWork{&r, r.tokens[i], rows[i].data(), &piece.k, &piece.v});
      }
    }
  }
  return state_rounds(grid, path, transport, store, hosted, work, extras);
}

}  // namespace cpd::protocol
