// The folds of the backward's gradients: dK/dV over the GQA group, dq over the partials (and the
// te_p2p lane's alike).
#include "engine/backward_folds.h"

#include <algorithm>

#include "cpdrift/bf16.h"
#include "cpdrift/production_lanes.h"
#include "engine/protocol_common.h"
#include "kernels/cpu/attention_backward.h"

namespace cpd::backward_folds {

std::vector<KvBlock> blocks_in(const CaseGrid& grid, const Range& tokens) {
  std::vector<KvBlock> out;
  for (const KvBlock& b : grid.blocks) {
    if (tokens.contains(b.range)) out.push_back(b);
  }
  return out;
}

namespace {

// A step of a te_p2p lane's BF16 sum: the pair's FP32 `sum` (n values; times `scale` where
// `scaled`) rounded to BF16, then `to` = it (the first step) or round_bf16(to + it).
void add_bf16_step(const float* sum, std::size_t n, bool scaled, float scale, bool first,
                   float* to) {
  for (std::size_t i = 0; i < n; ++i) {
    const float step = round_bf16(scaled ? sum[i] * scale : sum[i]);
    to[i] = first ? step : round_bf16(to[i] + step);
  }
}

// dq of one query block qb of part t (rank r's rows in a round; the messages' rows): the
// partials of the blocks it saw, in ascending block order, then the scale. With the te_p2p
// lane, its dq too: per KV CP rank in the order the backward ring brings them
// (te_backward_kv_source: r+1, r+2, …, r; ranks with no visible block skipped), the partials of
// its blocks folded in block order and scaled, rounded to BF16, summed in BF16.
void fold_dq_block(const CaseGrid& grid, RankGradients& rg, const Range& t, const KvBlock& qb,
                   const std::vector<const Message*>& terms) {
  const LogicalRank& r = rg.rank;
  const int dim = grid.problem.dims.head_dim, cp = grid.spec.cp;
  const float scale = grid.problem.dims.softmax_scale();
  const std::int64_t row = qb.range.begin - t.begin, rows = t.size(), heads = r.q_heads.size();
  const std::size_t n = static_cast<std::size_t>(qb.range.size()) * dim;
  std::vector<float> pair(rg.te_p2p ? n : 0);
  std::vector<const float*> ptrs;
  for (int b = 0; b < grid.problem.batch; ++b) {
    for (std::int64_t h = r.q_heads.begin; h < r.q_heads.end; ++h) {
      const std::int64_t at = (b * heads + (h - r.q_heads.begin)) * rows + row;
      ptrs.clear();
      for (const Message* m : terms) ptrs.push_back(m->payload.data() + at * dim);
      float* dq = rg.dq.at(b, h, rg.dq.shape.local_row(qb.range.begin));
      fold_terms(ptrs, n, dq);
      for (std::size_t i = 0; i < n; ++i) dq[i] *= scale;
      if (!rg.te_p2p) continue;
      float* lane = rg.te_p2p->dq.at(b, h, rg.te_p2p->dq.shape.local_row(qb.range.begin));
      bool first = true;
      for (int step = 0; step < cp; ++step) {
        const int s = te_backward_kv_source(r.cp_rank, step, cp);
        ptrs.clear();
        for (const Message* m : terms) {
          if (grid.blocks[static_cast<std::size_t>(m->header.block_index)].owner_cp_rank == s)
            ptrs.push_back(m->payload.data() + at * dim);
        }
        if (ptrs.empty()) continue;
        fold_terms(ptrs, n, pair.data());
        add_bf16_step(pair.data(), n, true, scale, first, lane);
        first = false;
      }
    }
  }
}

}  // namespace

void fold_kv_gradients(const CaseGrid& grid, const KvTotals& totals, ThreadPool& pool,
                       std::vector<RankGradients>& grads) {
  const int dim = grid.problem.dims.head_dim, group = grid.problem.dims.group_size();
  const int cp = grid.spec.cp;
  const float scale = grid.problem.dims.softmax_scale();
  pool.parallel_for(static_cast<std::int64_t>(totals.folds.size()), [&](std::int64_t i) {
    const KvTotals::Fold& f = totals.folds[static_cast<std::size_t>(i)];
    RankGradients& rg = grads[f.grad];
    const std::size_t n = static_cast<std::size_t>(f.block.range.size()) * dim;
    // The group's heads' terms of dK (which 0) or dV (1) at `first` (a head's dk, its dv next).
    const auto terms = [&](const std::vector<FloatBuffer>& of, std::size_t first, int which) {
      std::vector<const float*> t;
      for (int x = 0; x < group; ++x) t.push_back(of[first + 2 * x + which].data());
      return t;
    };
    const std::int64_t row = rg.dk.shape.local_row(f.block.range.begin);
    float* dk = rg.dk.at(f.b, f.g, row);
    fold_terms(terms(totals.head_totals, f.first_total, 0), n, dk);
    for (std::size_t e = 0; e < n; ++e) dk[e] *= scale;
    fold_terms(terms(totals.head_totals, f.first_total, 1), n, rg.dv.at(f.b, f.g, row));
    if (!rg.te_p2p) return;
    float* lane[2] = {rg.te_p2p->dk.at(f.b, f.g, row), rg.te_p2p->dv.at(f.b, f.g, row)};
    std::vector<float> pair(n);
    bool first = true;
    for (int step = 0; step < cp; ++step) {
      const int r = te_backward_dkv_visitor(rg.rank.cp_rank, step, cp);
      const std::size_t at = f.first_lane[static_cast<std::size_t>(r)];
      if (at == KvTotals::kNone) continue;
      for (int which = 0; which < 2; ++which) {
        fold_terms(terms(totals.lane_totals, at, which), n, pair.data());
        add_bf16_step(pair.data(), n, which == 0, scale, first, lane[which]);
      }
      first = false;
    }
  });
}

void fold_dq(const CaseGrid& grid, const Range& span, std::vector<Message> partials,
             const std::vector<LogicalRank>& hosted, Transport& transport, ThreadPool& pool,
             std::vector<RankGradients>& grads) {
  std::map<int, Inbox> dq_inboxes = protocol::superstep(
      transport, hosted, std::move(partials),
      [&](const LogicalRank& r) { return expected_dq_partials(grid, r, span); });
  struct Task {
    RankGradients* rg;
    Range part;
    KvBlock qb;
    std::vector<const Message*> terms;  // manifest order: ascending block index
  };
  std::vector<Task> tasks;
  for (RankGradients& rg : grads) {
    const std::vector<Message>& arrived = dq_inboxes.at(rg.rank.id).messages();
    for (const Message& m : arrived) rg.dq_partials.push_back(m.header);
    for (const Range& t : rg.rank.tokens) {
      const Range part = intersection(t, span);
      for (const KvBlock& qb : blocks_in(grid, part)) {
        Task& task = tasks.emplace_back(Task{&rg, part, qb, {}});
        for (const Message& m : arrived) {
          if (m.header.tokens() == part && causally_visible(m.header.block(), qb.range))
            task.terms.push_back(&m);
        }
      }
    }
  }
  pool.parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t i) {
    const Task& task = tasks[static_cast<std::size_t>(i)];
    fold_dq_block(grid, *task.rg, task.part, task.qb, task.terms);
  });
}

}  // namespace cpd::backward_folds
