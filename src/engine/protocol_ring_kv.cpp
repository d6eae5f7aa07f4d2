// ring_kv: K/V shards travel round the CP ring (CP−1 steps); each rank keeps its queries and
// every shard it has held, and computes and merges its states in global block order, one
// round's row groups at a time (Transformer Engine's p2p, made deterministic). Keeping the
// shards (linear in S) instead of the states (S² / split) is what lets the merge stream.
#include "cpdrift/backend/attention_backend.h"
#include "protocol_common.h"

namespace cpd::protocol {

std::vector<RankOutput> run_ring_kv(const CaseGrid& grid, const PathSpec& path,
                                    Transport& transport, InputStore& store, bool with_checks) {
  const int cp = grid.spec.cp;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const std::map<int, RankInputs> inputs = generate_inputs(grid, hosted, path, store);

  // Every piece each hosted rank has held, its own first; those from `latest[id]` on arrived
  // in the last step and travel on.
  std::map<int, std::vector<KvPiece>> held;
  std::map<int, std::size_t> latest;
  std::map<int, std::vector<std::vector<float>>> own_rows;
  for (const LogicalRank& r : hosted) {
    const RankInputs& in = inputs.at(r.id);
    held[r.id].push_back(KvPiece{in.k, in.v});
    latest[r.id] = 0;
    for (const Range& t : r.tokens) own_rows[r.id].push_back(rows_of(in.q, t));
  }
  for (int step = 1; step < cp; ++step) {
    std::vector<Message> outgoing;
    for (const LogicalRank& r : hosted) {
      const LogicalRank& next = grid.at(r.tp_rank, (r.cp_rank + 1) % cp);
      const std::vector<KvPiece>& pieces = held.at(r.id);
      for (std::size_t i = latest.at(r.id); i < pieces.size(); ++i) {
        for (const Range& t : pieces[i].k.shape.tokens) {
          outgoing.push_back(
              Message{kv_shard_header(grid, r, next, t), kv_payload(pieces[i].k, pieces[i].v, t)});
        }
      }
    }
    std::map<int, Inbox> kv_inboxes =
        superstep(transport, hosted, std::move(outgoing),
                  [&](const LogicalRank& r) { return expected_kv_ring(grid, r, step); });
    for (const LogicalRank& r : hosted) {
      latest.at(r.id) = held.at(r.id).size();
      for (const Message& m : kv_inboxes.at(r.id).messages())
        held.at(r.id).push_back(kv_piece_of(m, grid));
    }
  }

  return local_rounds(grid, path, transport, store.backend(), hosted, held, own_rows, with_checks);
}

}  // namespace cpd::protocol
