// ring_kv: K/V shards travel round the CP ring (CP−1 steps, Transformer Engine's p2p pattern);
// each rank keeps its queries and every shard it has held, then computes and merges its states
// in global block order, one round's row groups at a time. Keeping the shards (linear in S)
// instead of the states (S² / split) is what lets the merge stream; the transfers no longer
// overlap the compute.
#include "engine/protocol_common.h"
#include "kernels/attention_backend.h"

namespace cpd::protocol {

std::vector<RankOutput> run_ring_kv(const CaseGrid& grid, const PathSpec& path,
                                    Transport& transport, InputStore& store, MergeExtras extras) {
  const int cp = grid.spec.cp;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const std::map<int, RankInputs> inputs = generate_inputs(grid, hosted, path, store);

  // Every shard each hosted rank has held: its own (inputs), then the pieces that arrived;
  // those from `latest[id]` on arrived in the last step and travel on.
  std::map<int, std::vector<KvPiece>> arrived;
  std::map<int, std::size_t> latest;
  std::map<int, std::vector<FloatBuffer>> own_rows;
  for (const LogicalRank& r : hosted) {
    arrived[r.id];
    latest[r.id] = 0;
    for (const Range& t : r.tokens)
      own_rows[r.id].push_back(rows_of(inputs.at(r.id).q, t, store.pool()));
  }
  for (int step = 1; step < cp; ++step) {
    std::vector<Message> outgoing;
    for (const LogicalRank& r : hosted) {
      const LogicalRank& next = grid.at(r.tp_rank, (r.cp_rank + 1) % cp);
      const auto send = [&](const Shard& k, const Shard& v) {
        for (const Range& t : k.shape.tokens)
          outgoing.push_back(
              Message{kv_shard_header(grid, r, next, t), kv_payload(k, v, t, store.pool())});
      };
      const std::vector<KvPiece>& pieces = arrived.at(r.id);
      if (step == 1) send(inputs.at(r.id).k, inputs.at(r.id).v);
      for (std::size_t i = latest.at(r.id); i < pieces.size(); ++i) send(pieces[i].k, pieces[i].v);
    }
    std::map<int, Inbox> kv_inboxes =
        superstep(transport, hosted, std::move(outgoing),
                  [&](const LogicalRank& r) { return expected_kv_ring(grid, r, step); });
    for (const LogicalRank& r : hosted) {
      latest.at(r.id) = arrived.at(r.id).size();
      for (const Message& m : kv_inboxes.at(r.id).messages())
        arrived.at(r.id).push_back(kv_piece_of(m, grid));
    }
  }
  std::map<int, std::vector<KvView>> held;
  for (const LogicalRank& r : hosted) {
    const RankInputs& in = inputs.at(r.id);
    held[r.id].push_back(KvView{&in.k, &in.v});
    for (const KvPiece& piece : arrived.at(r.id)) held[r.id].push_back(KvView{&piece.k, &piece.v});
  }
  return local_rounds(grid, path, transport, store, hosted, held, own_rows, extras);
}

}  // namespace cpd::protocol
