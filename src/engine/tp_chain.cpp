#include "engine/tp_chain.h"

#include <map>

#include "engine/protocol_common.h"

namespace cpd {

void run_tp_chain(const CaseGrid& grid, const TpChain& chain, Transport& transport,
                  const std::vector<LogicalRank>& hosted, const ChainFold& fold,
                  const ChainFinish& finish) {
  std::map<int, std::vector<Range>> chunks;
  for (const LogicalRank& r : hosted) chunks[r.id] = chain_chunks(chain, r);
  const int tp = grid.spec.tp, steps = chain_steps(grid, chain);
  const auto expected = [&](int step) {
    return [&grid, &chain, step](const LogicalRank& r) {
      return expected_chain_partials(grid, chain, r, step);
    };
  };
  std::vector<FloatBuffer> spare;  // consumed planes, reused by the owners
  std::map<int, Inbox> received;   // what each hosted rank got in the last step
  for (int step = 0; step < steps; ++step) {
    std::vector<Message> outgoing;
    std::map<int, FloatBuffer> finished;  // TP = 1: the owner's own plane, complete
    for (std::size_t i = 0; i < hosted.size(); ++i) {
      const LogicalRank& r = hosted[i];
      const std::vector<Range>& mine = chunks.at(r.id);
      const int chunk = step - r.tp_rank;
      if (chunk < 0 || chunk >= static_cast<int>(mine.size())) continue;
      FloatBuffer z;
      if (r.tp_rank > 0) {
        // The plane holds the fold of exactly the heads below this rank's (manifest.cpp).
        z = std::move(received.at(r.id).take_messages().at(0).payload);
      } else if (!spare.empty()) {
        z = std::move(spare.back());
        spare.pop_back();
      }
      z = fold(i, mine[static_cast<std::size_t>(chunk)], std::move(z), r.tp_rank > 0);
      if (tp == 1) {
        finished[r.id] = std::move(z);
        continue;
      }
      const LogicalRank& next = grid.at((r.tp_rank + 1) % tp, r.cp_rank);
      for (const MessageHeader& h : expected_chain_partials(grid, chain, next, step)) {
        if (h.src == r.id) outgoing.push_back(Message{h, std::move(z)});
      }
    }
    received = protocol::superstep(transport, hosted, std::move(outgoing), expected(step));
    for (std::size_t i = 0; i < hosted.size(); ++i) {
      const LogicalRank& r = hosted[i];
      const int chunk = step - (tp - 1);
      if (r.tp_rank != 0 || chunk < 0 || chunk >= static_cast<int>(chunks.at(r.id).size()))
        continue;
      FloatBuffer z = tp == 1 ? std::move(finished.at(r.id))
                              : std::move(received.at(r.id).take_messages().at(0).payload);
      finish(i, chunks.at(r.id)[static_cast<std::size_t>(chunk)], z);
      spare.push_back(std::move(z));
    }
  }
}

}  // namespace cpd
