// allgather_kv: every rank gathers the K/V its queries can see and computes all its states
// locally (Llama-3 style); states never travel. They are computed and merged one round's row
// groups at a time.
#include "engine/protocol_common.h"
#include "kernels/attention_backend.h"

namespace cpd::protocol {

std::vector<RankOutput> run_allgather_kv(const CaseGrid& grid, const PathSpec& path,
                                         Transport& transport, InputStore& store,
                                         MergeExtras extras) {
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const std::map<int, RankInputs> inputs = generate_inputs(grid, hosted, path, store);

  std::vector<Message> outgoing;
  for (const LogicalRank& dst : grid.ranks) {
    for (const MessageHeader& h : expected_kv_allgather(grid, dst)) {
      if (inputs.count(h.src) != 0) {
        const RankInputs& in = inputs.at(h.src);
        outgoing.push_back(Message{h, kv_payload(in.k, in.v, h.tokens(), store.pool())});
      }
    }
  }
  const std::map<int, Inbox> kv_inboxes =
      superstep(transport, hosted, std::move(outgoing),
                [&](const LogicalRank& r) { return expected_kv_allgather(grid, r); });

  // Every hosted rank's K/V: its own, then what it gathered; and its own query rows.
  std::map<int, std::vector<KvPiece>> gathered;
  std::map<int, std::vector<FloatBuffer>> own_rows;
  for (const LogicalRank& r : hosted) {
    for (const Message& m : kv_inboxes.at(r.id).messages())
      gathered[r.id].push_back(kv_piece_of(m, grid));
    for (const Range& t : r.tokens)
      own_rows[r.id].push_back(rows_of(inputs.at(r.id).q, t, store.pool()));
  }
  std::map<int, std::vector<KvView>> kv;
  for (const LogicalRank& r : hosted) {
    const RankInputs& in = inputs.at(r.id);
    kv[r.id].push_back(KvView{&in.k, &in.v});
    for (const KvPiece& piece : gathered[r.id]) kv[r.id].push_back(KvView{&piece.k, &piece.v});
  }

  return local_rounds(grid, path, transport, store, hosted, kv, own_rows, extras);
}

}  // namespace cpd::protocol
