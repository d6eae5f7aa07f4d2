// ag_rs: all-gather the query rows, compute each state where its K/V live, send it to the
// query owner, merge there in global block order (a reduce-scatter whose reduction is the
// ordered merge). The default; the reference benchmark's semantics. The states move and merge
// one round's row groups at a time.
#include "engine/protocol_common.h"

namespace cpd::protocol {

std::vector<RankOutput> run_ag_rs(const CaseGrid& grid, const PathSpec& path, Transport& transport,
                                  InputStore& store, MergeExtras extras) {
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const std::map<int, RankInputs> inputs = generate_inputs(grid, hosted, path, store);
  // Query rows go to every CP peer owning a block they can see.
  const std::map<int, Inbox> q_inboxes = exchange(
      grid, transport, hosted, [&](const LogicalRank& r) { return expected_q_shards(grid, r); },
      [&](const MessageHeader& h) {
        return rows_of(inputs.at(h.src).q, h.tokens(), store.pool());
      });

  // The query ranges each hosted KV owner serves against its blocks: its own (in place or
  // copied out, see serves_own_rows_in_place), and those that arrived.
  std::vector<FloatBuffer> own_rows;  // inner buffers stay put when this grows
  std::vector<StateWork> work;
  for (const LogicalRank& owner : hosted) {
    const RankInputs& in = inputs.at(owner.id);
    for (const Range& t : owner.tokens) {
      const float* rows = in.q.data.data();
      if (!serves_own_rows_in_place(grid.spec.protocol, owner)) {
        own_rows.push_back(rows_of(in.q, t, store.pool()));
        rows = own_rows.back().data();
      }
      work.push_back(StateWork{&owner, t, rows, &in.k, &in.v});
    }
    for (const Message& m : q_inboxes.at(owner.id).messages()) {
      const LogicalRank* src = &grid.ranks[static_cast<std::size_t>(m.header.src)];
      work.push_back(StateWork{src, m.header.tokens(), m.payload.data(), &in.k, &in.v});
    }
  }
  return state_rounds(grid, path, transport, store, hosted, work, extras);
}

}  // namespace cpd::protocol
