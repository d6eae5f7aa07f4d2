#include "engine/case_execution.h"

#include <algorithm>
#include <cstdint>

#include "kernels/attention_backend.h"

namespace cpd {
namespace {

// Per TP rank, the blocks the headers name (states or dq partials received by the hosted
// query owners), as the headers describe them, from every process. Each is stored +1 in a max
// reduction, so 0 means "no process saw it".
std::vector<std::vector<ExecutedBlock>> executed_blocks(const CaseGrid& grid,
                                                        const std::vector<Received>& received,
                                                        const Collectives& collectives) {
  const std::size_t tp = static_cast<std::size_t>(grid.spec.tp), blocks = grid.blocks.size();
  std::vector<std::uint64_t> seen(3 * tp * blocks, 0);  // begin, end, owner CP rank
  const auto at = [&](int field, int tp_rank, int block) {
    return (static_cast<std::size_t>(field) * tp + static_cast<std::size_t>(tp_rank)) * blocks +
           static_cast<std::size_t>(block);
  };
  for (const Received& r : received) {
    const MessageHeader& h = r.header;
    const int t = r.tp_rank;
    const int owner = grid.ranks[static_cast<std::size_t>(h.src)].cp_rank;
    seen[at(0, t, h.block_index)] = static_cast<std::uint64_t>(h.block_begin) + 1;
    seen[at(1, t, h.block_index)] = static_cast<std::uint64_t>(h.block_end) + 1;
    seen[at(2, t, h.block_index)] = static_cast<std::uint64_t>(owner) + 1;
  }
  collectives.max(seen);
  std::vector<std::vector<ExecutedBlock>> out(tp);
  for (std::size_t t = 0; t < tp; ++t) {
    for (std::size_t b = 0; b < blocks; ++b) {
      const int ti = static_cast<int>(t), bi = static_cast<int>(b);
      if (seen[at(0, ti, bi)] == 0) continue;
      out[t].push_back(ExecutedBlock{bi,
                                     Range{static_cast<std::int64_t>(seen[at(0, ti, bi)] - 1),
                                           static_cast<std::int64_t>(seen[at(1, ti, bi)] - 1)},
                                     static_cast<int>(seen[at(2, ti, bi)] - 1)});
    }
  }
  return out;
}

// Per CP query owner (TP rank 0), the indices of the blocks it received, from every process.
std::vector<std::vector<int>> merged_indices(const CaseGrid& grid,
                                             const std::vector<Received>& received,
                                             const Collectives& collectives) {
  const std::size_t blocks = grid.blocks.size();
  std::vector<std::uint64_t> merged(static_cast<std::size_t>(grid.spec.cp) * blocks, 0);
  for (const Received& r : received) {
    if (r.tp_rank != 0) continue;
    ++merged[static_cast<std::size_t>(r.cp_rank) * blocks +
             static_cast<std::size_t>(r.header.block_index)];
  }
  collectives.sum(merged);
  std::vector<std::vector<int>> out(static_cast<std::size_t>(grid.spec.cp));
  for (std::size_t i = 0; i < merged.size(); ++i) {
    if (merged[i] > 0) out[i / blocks].push_back(static_cast<int>(i % blocks));
  }
  return out;
}

}  // namespace

CaseExecution record_execution(const RunContext& ctx, const CaseGrid& grid,
                               const std::vector<RankOutput>& fp32,
                               const std::vector<Received>& dq_partials,
                               const TransportCounters& before, const TransportCounters& excluded,
                               std::chrono::steady_clock::time_point started) {
  std::vector<Received> states;
  for (const RankOutput& o : fp32) {
    for (const MessageHeader& h : o.merged_states)
      states.push_back(Received{o.rank.tp_rank, o.rank.cp_rank, h});
  }
  CaseExecution e;
  e.started = started;
  e.backend = ctx.inputs.backend().name();
  e.transport = ctx.transport.name();
  e.processes_used = std::min(ctx.transport.world_size(), grid.spec.num_logical_ranks());
  e.merged_blocks = executed_blocks(grid, states, ctx.collectives);
  e.merged_block_indices = merged_indices(grid, states, ctx.collectives);
  if (ctx.cp1_backward != nullptr)
    e.backward_blocks = executed_blocks(grid, dq_partials, ctx.collectives);
  for (const KvBlock& b : grid.blocks) e.block_bounds.push_back(b.range);
  for (int r = 0; r < grid.spec.cp; ++r) e.query_tokens.push_back(grid.at(0, r).tokens);
  const TransportCounters case_moved = ctx.transport.counters() - before - excluded;
  std::uint64_t moved[3] = {case_moved.messages, case_moved.bytes, case_moved.remote_bytes};
  ctx.collectives.sum(moved);
  e.moved = TransportCounters{moved[0], moved[1], moved[2]};
  return e;
}

}  // namespace cpd
