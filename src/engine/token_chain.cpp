#include "engine/token_chain.h"

#include <algorithm>
#include <map>

#include "engine/protocol_common.h"

namespace cpd {

std::vector<TokenStage> token_stages(const CaseGrid& grid) {
  // Every CP rank's ranges (the same on every TP rank), by position.
  std::vector<std::pair<Range, int>> ranges;
  for (int c = 0; c < grid.spec.cp; ++c) {
    for (const Range& t : grid.at(0, c).tokens) ranges.emplace_back(t, c);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.first.begin < b.first.begin; });
  std::vector<TokenStage> stages;
  for (int b = 0; b < grid.problem.batch; ++b) {
    for (const auto& [tokens, c] : ranges) {
      if (stages.empty() || stages.back().cp_rank != c) stages.push_back(TokenStage{c, {}});
      stages.back().visits.emplace_back(b, tokens);
    }
  }
  return stages;
}

std::vector<Range> token_pieces(const TokenChain& chain) {
  std::vector<Range> pieces;
  for (std::int64_t o = 0; o < chain.outputs; o += chain.piece_rows)
    pieces.push_back(Range{o, std::min(chain.outputs, o + chain.piece_rows)});
  return pieces;
}

int token_chain_steps(const CaseGrid& grid, const TokenChain& chain) {
  return static_cast<int>(token_pieces(chain).size() + token_stages(grid).size()) - 1;
}

int token_chain_holder(const CaseGrid& grid) { return token_stages(grid).back().cp_rank; }

namespace {

MessageHeader token_header(const CaseGrid& grid, const TokenChain& chain, const LogicalRank& src,
                           const LogicalRank& dst, int stage, const Range& piece) {
  MessageHeader h;
  h.kind = MessageKind::token_partial;
  h.src = src.id;
  h.dst = dst.id;
  h.block_index = stage;
  h.token_begin = piece.begin;
  h.token_end = piece.end;
  h.batch = grid.problem.batch;
  h.width = static_cast<std::int32_t>(chain.inputs);
  h.floats = chain.planes * piece.size() * chain.inputs;
  return h;
}

}  // namespace

std::vector<MessageHeader> expected_token_partials(const CaseGrid& grid, const TokenChain& chain,
                                                   const LogicalRank& dst, int step) {
  const std::vector<TokenStage> stages = token_stages(grid);
  const std::vector<Range> pieces = token_pieces(chain);
  std::vector<MessageHeader> out;
  for (std::size_t k = 1; k < stages.size(); ++k) {
    if (stages[k].cp_rank != dst.cp_rank) continue;
    const int piece = step - static_cast<int>(k - 1);
    if (piece < 0 || piece >= static_cast<int>(pieces.size())) continue;
    const LogicalRank& src = grid.at(dst.tp_rank, stages[k - 1].cp_rank);
    out.push_back(token_header(grid, chain, src, dst, static_cast<int>(k),
                               pieces[static_cast<std::size_t>(piece)]));
  }
  return out;
}

void run_token_chain(const CaseGrid& grid, const TokenChain& chain, Transport& transport,
                     const std::vector<LogicalRank>& hosted, const TokenFold& fold,
                     const TokenFinish& finish) {
  const std::vector<TokenStage> stages = token_stages(grid);
  const std::vector<Range> pieces = token_pieces(chain);
  const int steps = token_chain_steps(grid, chain);
  std::map<int, std::vector<Message>> received;  // by hosted rank: the last step's pieces
  for (int step = 0; step < steps; ++step) {
    std::vector<Message> outgoing;
    for (std::size_t i = 0; i < hosted.size(); ++i) {
      const LogicalRank& r = hosted[i];
      for (std::size_t k = 0; k < stages.size(); ++k) {
        const int p = step - static_cast<int>(k);
        if (stages[k].cp_rank != r.cp_rank || p < 0 || p >= static_cast<int>(pieces.size()))
          continue;
        const Range& piece = pieces[static_cast<std::size_t>(p)];
        FloatBuffer plane;
        const std::int64_t size = piece.size() * chain.inputs;
        if (k == 0) {
          plane.resize(static_cast<std::size_t>(chain.planes * size));
          mark_unwritten(plane);  // the first block stores every element
        } else {
          std::vector<Message>& in = received[r.id];
          const auto it = std::find_if(in.begin(), in.end(), [&](const Message& m) {
            return m.header.block_index == static_cast<std::int32_t>(k);
          });
          plane = std::move(it->payload);  // the manifest listed it: it arrived
        }
        // This CP rank's own partial: its plane, continued after the rank's earlier stage.
        float* own = chain.planes > 2 ? plane.data() + (2 + r.cp_rank) * size : nullptr;
        const bool own_continues =
            std::any_of(stages.begin(), stages.begin() + k,
                        [&](const auto& s) { return s.cp_rank == r.cp_rank; });
        if (k > 0 && chain.rank_sums) {
          FloatBuffer sums(static_cast<std::size_t>(2 * size));
          fold(i, stages[k], piece, sums.data(), true, own, own_continues);
          for (std::size_t e = 0; e < sums.size(); ++e) plane[e] += sums[e];
        } else {
          // The first stage's candidate sum is its CP rank's partial so far: copied, not folded
          // again.
          fold(i, stages[k], piece, plane.data(), k == 0, k == 0 ? nullptr : own, own_continues);
          if (k == 0 && own != nullptr)
            std::copy_n(plane.data(), static_cast<std::size_t>(size), own);
        }
        if (k + 1 == stages.size()) {
          finish(i, piece, plane);
          continue;
        }
        const LogicalRank& next = grid.at(r.tp_rank, stages[k + 1].cp_rank);
        outgoing.push_back(Message{
            token_header(grid, chain, r, next, static_cast<int>(k + 1), piece), std::move(plane)});
      }
    }
    std::map<int, Inbox> inboxes = protocol::superstep(
        transport, hosted, std::move(outgoing),
        [&](const LogicalRank& r) { return expected_token_partials(grid, chain, r, step); });
    received.clear();
    for (auto& [id, inbox] : inboxes) received[id] = inbox.take_messages();
  }
}

}  // namespace cpd
