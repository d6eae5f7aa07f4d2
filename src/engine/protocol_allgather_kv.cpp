// allgather_kv: every rank gathers the K/V its queries can see and computes all its states
// locally (Llama-3 style); states never travel.
#include "cpdrift/backend/attention_backend.h"
#include "protocol_common.h"

namespace cpd::protocol {

std::vector<RankOutput> run_allgather_kv(const CaseGrid& grid, const PathSpec& path,
                                         Transport& transport, InputStore& store,
                                         bool keep_states) {
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const std::map<int, RankInputs> inputs = generate_inputs(grid, hosted, path, store);

  std::vector<Message> outgoing;
  for (const LogicalRank& dst : grid.ranks) {
    for (const MessageHeader& h : expected_kv_allgather(grid, dst)) {
      if (inputs.count(h.src) != 0) {
        const RankInputs& in = inputs.at(h.src);
        outgoing.push_back(Message{h, kv_payload(in.k, in.v, h.tokens())});
      }
    }
  }
  std::map<int, Inbox> kv_inboxes =
      superstep(transport, hosted, std::move(outgoing),
                [&](const LogicalRank& r) { return expected_kv_allgather(grid, r); });

  std::vector<Message> states;
  std::vector<BlockJob> jobs;
  for (const LogicalRank& owner : hosted) {
    const RankInputs& in = inputs.at(owner.id);
    std::vector<std::vector<float>> own_rows;
    for (const Range& t : owner.tokens) own_rows.push_back(rows_of(in.q, t));
    own_states(grid, owner, own_rows.data(), in.k, in.v, states, jobs);
    std::vector<KvPiece> gathered;
    for (const Message& m : kv_inboxes.at(owner.id).messages())
      gathered.push_back(kv_piece_of(m, grid));
    for (const KvPiece& piece : gathered)
      own_states(grid, owner, own_rows.data(), piece.k, piece.v, states, jobs);
    run_state_jobs(grid, path, jobs, store.backend());
    jobs.clear();
  }
  // The states were computed here, but they are checked against the same manifest.
  std::map<int, Inbox> state_inboxes =
      inboxes_for(hosted, [&](const LogicalRank& r) { return expected_states(grid, r); });
  check_local(transport, std::move(states), state_inboxes);
  return merge_owned_states(grid, hosted, state_inboxes, store.backend(), keep_states);
}

}  // namespace cpd::protocol
