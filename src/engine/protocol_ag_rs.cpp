// ag_rs: all-gather the query rows, compute each state where its K/V live, send it to the
// query owner, merge there in global block order (a reduce-scatter whose reduction is the
// ordered merge). The default; the reference benchmark's semantics. The states move and merge
// one round's row groups at a time.
#include "engine/protocol_common.h"
#include "kernels/attention_backend.h"

namespace cpd::protocol {

std::vector<RankOutput> run_ag_rs(const CaseGrid& grid, const PathSpec& path, Transport& transport,
                                  InputStore& store, MergeExtras extras) {
  const int dim = grid.problem.dims.head_dim;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const std::map<int, RankInputs> inputs = generate_inputs(grid, hosted, path, store);

  // Superstep 1: query rows go to every CP peer owning a block they can see.
  std::vector<Message> outgoing;
  for (const LogicalRank& dst : grid.ranks) {
    for (const MessageHeader& h : expected_q_shards(grid, dst)) {
      if (inputs.count(h.src) != 0)
        outgoing.push_back(Message{h, rows_of(inputs.at(h.src).q, h.tokens(), store.pool())});
    }
  }
  const std::map<int, Inbox> q_inboxes =
      superstep(transport, hosted, std::move(outgoing),
                [&](const LogicalRank& r) { return expected_q_shards(grid, r); });

  // The query ranges each hosted KV owner serves: its own (in place or copied out, see
  // serves_own_rows_in_place), and those that arrived.
  std::vector<FloatBuffer> own_rows;  // inner buffers stay put when this grows
  std::map<int, std::vector<QueryPiece>> served;
  for (const LogicalRank& owner : hosted) {
    const Shard& q = inputs.at(owner.id).q;
    for (const Range& t : owner.tokens) {
      const float* rows = q.data.data();
      if (!serves_own_rows_in_place(grid.spec.protocol, owner)) {
        own_rows.push_back(rows_of(q, t, store.pool()));
        rows = own_rows.back().data();
      }
      served[owner.id].push_back(QueryPiece::range(&owner, t, rows));
    }
    for (const Message& m : q_inboxes.at(owner.id).messages()) {
      served[owner.id].push_back(
          QueryPiece::range(&grid.ranks[static_cast<std::size_t>(m.header.src)], m.header.tokens(),
                            m.payload.data()));
    }
  }

  // Each round: states of every served range's group against the owner's blocks, to the
  // query owners, merged there.
  std::vector<RankOutput> outputs = start_outputs(grid, hosted, extras);
  const int rounds = grid.rounds();
  PayloadPool pool;
  for (int round = 0; round < rounds; ++round) {
    std::vector<Message> states;
    std::vector<BlockJob> jobs;
    for (const LogicalRank& owner : hosted) {
      const RankInputs& in = inputs.at(owner.id);
      for (const QueryPiece& piece : served.at(owner.id)) {
        const Range group = grid.round_group(piece.tokens, round);
        if (group.empty()) continue;
        const QueryPiece q = piece.group(group, dim);
        for (const KvBlock& block : grid.blocks_of(owner.cp_rank)) {
          if (causally_visible(block.range, q.tokens))
            states.push_back(state_message(grid, q, block, in.k, in.v, jobs, pool));
        }
      }
    }
    run_state_jobs(grid, path, jobs, store.backend());
    const std::size_t made = states.size();
    std::map<int, Inbox> inboxes =
        superstep(transport, hosted, std::move(states),
                  [&](const LogicalRank& r) { return expected_states(grid, r, round); });
    merge_round(grid, round, hosted, inboxes, store, outputs);
    pool.give_back(inboxes, made);
  }
  return outputs;
}

}  // namespace cpd::protocol
