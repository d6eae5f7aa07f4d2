// ag_rs: all-gather the query rows, compute each state where its K/V live, send it to the
// query owner, merge there in global block order (a reduce-scatter whose reduction is the
// ordered merge). The default; the reference benchmark's semantics.
#include "cpdrift/backend/attention_backend.h"
#include "protocol_common.h"

namespace cpd::protocol {

std::vector<RankOutput> run_ag_rs(const CaseGrid& grid, const PathSpec& path, Transport& transport,
                                  InputStore& store, bool keep_states) {
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const std::map<int, RankInputs> inputs = generate_inputs(grid, hosted, path, store);

  // Superstep 1: query rows go to every CP peer owning a block they can see.
  std::vector<Message> outgoing;
  for (const LogicalRank& dst : grid.ranks) {
    for (const MessageHeader& h : expected_q_shards(grid, dst)) {
      if (inputs.count(h.src) != 0)
        outgoing.push_back(Message{h, rows_of(inputs.at(h.src).q, h.tokens())});
    }
  }
  std::map<int, Inbox> q_inboxes =
      superstep(transport, hosted, std::move(outgoing),
                [&](const LogicalRank& r) { return expected_q_shards(grid, r); });

  // Superstep 2: states of every served query range against the owner's blocks.
  std::vector<Message> states;
  std::vector<BlockJob> jobs;
  std::vector<std::vector<float>> own_rows;  // inner buffers stay put when this grows
  for (const LogicalRank& owner : hosted) {
    const RankInputs& in = inputs.at(owner.id);
    std::vector<QueryPiece> served;
    for (const Range& t : owner.tokens) {
      own_rows.push_back(rows_of(in.q, t));
      served.push_back(QueryPiece{&owner, t, own_rows.back().data()});
    }
    for (const Message& m : q_inboxes.at(owner.id).messages()) {
      served.push_back(QueryPiece{&grid.ranks[static_cast<std::size_t>(m.header.src)],
                                  m.header.tokens(), m.payload.data()});
    }
    for (const QueryPiece& q : served) {
      for (const KvBlock& block : grid.blocks_of(owner.cp_rank)) {
        if (causally_visible(block.range, q.tokens))
          states.push_back(state_message(grid, q, block, in.k, in.v, jobs));
      }
    }
    run_state_jobs(grid, path, jobs, store.backend());
    jobs.clear();
  }
  std::map<int, Inbox> state_inboxes =
      superstep(transport, hosted, std::move(states),
                [&](const LogicalRank& r) { return expected_states(grid, r); });
  return merge_owned_states(grid, hosted, state_inboxes, store.backend(), keep_states);
}

}  // namespace cpd::protocol
