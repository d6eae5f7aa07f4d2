// ring_kv: K/V shards travel round the CP ring (CP−1 steps); each rank keeps its queries,
// computes its states against the shard it holds while the next one is in flight, and merges
// all of them in global block order at the end (Transformer Engine's p2p, made deterministic).
#include "cpdrift/backend/attention_backend.h"
#include "protocol_common.h"

namespace cpd::protocol {

std::vector<RankOutput> run_ring_kv(const CaseGrid& grid, const PathSpec& path,
                                    Transport& transport, InputStore& store, bool keep_states) {
  const int cp = grid.spec.cp;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const std::map<int, RankInputs> inputs = generate_inputs(grid, hosted, path, store);

  // What each hosted rank holds at the current step: its own shard first, then forwarded ones.
  std::map<int, std::vector<KvPiece>> held;
  std::map<int, std::vector<std::vector<float>>> own_rows;
  for (const LogicalRank& r : hosted) {
    const RankInputs& in = inputs.at(r.id);
    held[r.id].push_back(KvPiece{in.k, in.v});
    for (const Range& t : r.tokens) own_rows[r.id].push_back(rows_of(in.q, t));
  }

  std::vector<Message> states;
  std::vector<BlockJob> jobs;
  for (int step = 0; step < cp; ++step) {
    const bool forward = step + 1 < cp;
    if (forward) {
      std::vector<Message> outgoing;
      for (const LogicalRank& r : hosted) {
        const LogicalRank& next = grid.at(r.tp_rank, (r.cp_rank + 1) % cp);
        for (const KvPiece& piece : held.at(r.id)) {
          for (const Range& t : piece.k.shape.tokens) {
            outgoing.push_back(
                Message{kv_shard_header(grid, r, next, t), kv_payload(piece.k, piece.v, t)});
          }
        }
      }
      transport.start(std::move(outgoing));  // in flight while this step computes
    }
    for (const LogicalRank& r : hosted) {
      for (const KvPiece& piece : held.at(r.id)) {
        own_states(grid, r, own_rows.at(r.id).data(), piece.k, piece.v, states, jobs);
      }
    }
    run_state_jobs(grid, path, jobs, store.backend());
    jobs.clear();
    if (forward) {
      std::map<int, Inbox> kv_inboxes = inboxes_for(
          hosted, [&](const LogicalRank& r) { return expected_kv_ring(grid, r, step + 1); });
      deliver(transport, kv_inboxes);
      for (const LogicalRank& r : hosted) {
        std::vector<KvPiece>& pieces = held.at(r.id);
        pieces.clear();
        for (const Message& m : kv_inboxes.at(r.id).messages())
          pieces.push_back(kv_piece_of(m, grid));
      }
    }
  }
  std::map<int, Inbox> state_inboxes =
      inboxes_for(hosted, [&](const LogicalRank& r) { return expected_states(grid, r); });
  check_local(transport, std::move(states), state_inboxes);
  return merge_owned_states(grid, hosted, state_inboxes, store.backend(), keep_states);
}

}  // namespace cpd::protocol
