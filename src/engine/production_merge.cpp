// The production lanes of a round's rows (numerics.md §10): the states the canonical merge
// folds, regrouped per CP rank (each rank's kernel call, folded by the backend's canonical
// merge) and merged in each stack's order.
#include <algorithm>

#include "core/util/work_timers.h"
#include "cpdrift/production_lanes.h"
#include "engine/protocol_common.h"

namespace cpd::protocol {

void merge_production_lanes(const CaseGrid& grid, const LogicalRank& r,
                            const std::vector<Range>& groups, const std::vector<Message>& states,
                            AttentionBackend& backend, ThreadPool& pool,
                            std::vector<AttnShard>& lanes) {
  const int dim = grid.problem.dims.head_dim, batch = grid.problem.batch, cp = grid.spec.cp;
  const std::int64_t heads = r.q_heads.size(), slots = batch * heads;
  const std::size_t calls = static_cast<std::size_t>(cp * slots);
  const auto call = [&](int rank, std::int64_t slot) {
    return static_cast<std::size_t>(rank * slots + slot);
  };
  // Per (CP rank, slot) call, kLaneRows rows of output [n][dim] and lse [n]; reused by every
  // step, each call's rows written by its merge or set to the identity.
  std::vector<float> out(calls * static_cast<std::size_t>(kLaneRows * dim));
  std::vector<float> lse(calls * static_cast<std::size_t>(kLaneRows));
  for (const Range& t : groups) {
    const std::int64_t rows = t.size(), row0 = lanes[0].out.shape.local_row(t.begin);
    std::vector<const Message*> of_range;
    for (const Message& m : states) {
      if (m.header.tokens() == t) of_range.push_back(&m);
    }
    // kLaneRows rows at a time: per (CP rank, slot), that rank's kernel call on them, [n][dim]
    // and [n]; the identity where the rank holds no visible block.
    for (std::int64_t first = 0; first < rows; first += kLaneRows) {
      const std::int64_t n = std::min(kLaneRows, rows - first);
      std::vector<MergeJob> jobs(calls);
      for (const Message* m : of_range) {
        const int owner =
            grid.blocks[static_cast<std::size_t>(m->header.block_index)].owner_cp_rank;
        const float* o = m->payload.data();
        for (std::int64_t slot = 0; slot < slots; ++slot) {
          jobs[call(owner, slot)].states.push_back(
              StateRef{m->header.block_index, o + (slot * rows + first) * dim,
                       o + slots * rows * dim + slot * rows + first});
        }
      }
      std::vector<MergeJob> nonempty;
      for (std::size_t c = 0; c < calls; ++c) {
        float* call_out = out.data() + c * static_cast<std::size_t>(n * dim);
        float* call_lse = lse.data() + c * static_cast<std::size_t>(n);
        if (jobs[c].states.empty()) {
          std::fill_n(call_out, n * dim, 0.0f);
          std::fill_n(call_lse, n, neg_inf_f32());
          continue;
        }
        jobs[c].rows = n;
        jobs[c].out = call_out;
        jobs[c].lse = call_lse;
        nonempty.push_back(std::move(jobs[c]));
      }
      backend.merge_states(nonempty, dim);
      const WorkTimer timer(WorkKind::merge);
      // Per (batch, head) slot: its calls' outputs rounded to BF16 (each kernel call writes
      // BF16), then its rows merged as each lane does. Slots share nothing.
      pool.parallel_for(slots, [&](std::int64_t slot) {
        const int b = static_cast<int>(slot / heads);
        const std::int64_t h = r.q_heads.begin + slot % heads;
        for (int s = 0; s < cp; ++s) {
          float* o = out.data() + call(s, slot) * static_cast<std::size_t>(n * dim);
          for (std::int64_t k = 0; k < n * dim; ++k) o[k] = round_bf16(o[k]);
        }
        std::vector<RankState> by_rank(static_cast<std::size_t>(cp));
        for (std::int64_t i = 0; i < n; ++i) {
          for (int s = 0; s < cp; ++s) {
            const std::size_t c = call(s, slot);
            by_rank[static_cast<std::size_t>(s)] =
                RankState{out.data() + (c * n + i) * dim, lse[c * n + i]};
          }
          const std::int64_t row = row0 + first + i;
          for (std::size_t k = 0; k < kProductionLanes.size(); ++k) {
            production_row(kProductionLanes[k], by_rank, r.cp_rank, dim, lanes[k].out.at(b, h, row),
                           lanes[k].lse.at(b, h, row));
          }
        }
      });
    }
  }
}

}  // namespace cpd::protocol
