// The distributed backward: query rows to the KV owners, block pairs there, partial dq back.
#include "engine/backward.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "cpdrift/attention_backward_math.h"
#include "engine/backward_folds.h"
#include "engine/protocol_common.h"
#include "kernels/attention_backend.h"

namespace cpd {
namespace {

using backward_folds::blocks_in;
using backward_folds::fold_dq;
using backward_folds::fold_kv_gradients;
using backward_folds::KvTotals;

// A query range's backward inputs packed as one payload: q, dO ([B][H][R][D] each), lse, Δ
// ([B][H][R] each). The same layout whether the range is local or arrived in a message.
struct PackedRows {
  const LogicalRank* owner;
  Range tokens;
  const float* data;
  int batch, dim;

  std::int64_t heads() const { return owner->q_heads.size(); }
  std::int64_t slot(int b, std::int64_t h) const {
    return b * heads() + (h - owner->q_heads.begin);
  }
  std::int64_t block_floats() const { return batch * heads() * tokens.size() * dim; }
  const float* q(int b, std::int64_t h, std::int64_t row) const {
    return data + (slot(b, h) * tokens.size() + row) * dim;
  }
  const float* d_out(int b, std::int64_t h, std::int64_t row) const {
    return q(b, h, row) + block_floats();
  }
  const float* lse(int b, std::int64_t h, std::int64_t row) const {
    return data + 2 * block_floats() + slot(b, h) * tokens.size() + row;
  }
  const float* delta(int b, std::int64_t h, std::int64_t row) const {
    return lse(b, h, row) + batch * heads() * tokens.size();
  }
};

// The backward inputs of rank r's rows `part` packed as one payload (PackedRows' layout): q and
// dO read in place from the input memo (prepared), lse and Δ from the saved forward; a (b, h)
// slot a task on the pool.
FloatBuffer pack_rows(InputStore& inputs, const LogicalRank& r, const AttnShard& fwd,
                      const Range& part, int dim) {
  const int batch = inputs.problem().batch;
  const std::int64_t heads = r.q_heads.size(), rows = part.size();
  const std::size_t slots = static_cast<std::size_t>(batch * heads);
  const std::size_t n = static_cast<std::size_t>(rows * dim);
  FloatBuffer payload = unwritten_floats(slots * (2 * n + 2 * static_cast<std::size_t>(rows)));
  float* const q = payload.data();
  float* const d_out = q + slots * n;
  float* const lse = d_out + slots * n;
  float* const delta = lse + slots * static_cast<std::size_t>(rows);
  // The rows' addresses are looked up here, on this thread: the memo's index is not for
  // concurrent lookups.
  std::vector<const float*> q_rows, d_out_rows;
  for (int b = 0; b < batch; ++b) {
    for (std::int64_t h = r.q_heads.begin; h < r.q_heads.end; ++h) {
      q_rows.push_back(inputs.row(TensorId::q, b, h, part.begin));
      d_out_rows.push_back(inputs.row(TensorId::d_out, b, h, part.begin));
    }
  }
  inputs.pool().parallel_for(static_cast<std::int64_t>(slots), [&](std::int64_t i) {
    const auto s = static_cast<std::size_t>(i);
    const int b = static_cast<int>(i / heads);
    const std::int64_t h = r.q_heads.begin + i % heads;
    std::copy_n(q_rows[s], n, q + s * n);
    std::copy_n(d_out_rows[s], n, d_out + s * n);
    std::copy_n(fwd.lse.at(b, h, fwd.lse.shape.local_row(part.begin)), rows,
                lse + s * static_cast<std::size_t>(rows));
    const float* out = fwd.out.at(b, h, fwd.out.shape.local_row(part.begin));
    for (std::int64_t k = 0; k < rows; ++k) {
      delta[s * static_cast<std::size_t>(rows) + static_cast<std::size_t>(k)] =
          backward_delta(d_out_rows[s] + k * dim, out + k * dim, dim);
    }
  });
  return payload;
}

// A round's query rows, packed (q, dO, lse, Δ): each hosted rank's ranges cut to the round's
// span (`own[id][t]`, empty where range t has no row in it) and what arrived from the other CP
// ranks for the KV blocks hosted here.
struct ExchangedRows {
  std::map<int, std::vector<FloatBuffer>> own;
  std::map<int, Inbox> inboxes;
};

ExchangedRows exchange_rows(const CaseGrid& grid, const Range& span,
                            const std::vector<LogicalRank>& hosted,
                            const std::map<int, const RankOutput*>& forward, Transport& transport,
                            InputStore& inputs) {
  const int dim = grid.problem.dims.head_dim;
  ExchangedRows rows;
  for (const LogicalRank& r : hosted) {
    for (const Range& t : r.tokens) {
      const Range part = intersection(t, span);
      rows.own[r.id].push_back(
          part.empty() ? FloatBuffer{} : pack_rows(inputs, r, forward.at(r.id)->merged, part, dim));
    }
  }
  rows.inboxes = protocol::exchange(
      grid, transport, hosted,
      [&](const LogicalRank& r) { return expected_backward_rows(grid, r, span); },
      [&](const MessageHeader& h) {
        const std::vector<Range>& tokens = grid.ranks[static_cast<std::size_t>(h.src)].tokens;
        const auto at = std::find_if(tokens.begin(), tokens.end(),
                                     [&](const Range& t) { return t.contains(h.tokens()); });
        return rows.own.at(h.src)[static_cast<std::size_t>(at - tokens.begin())];
      });
  return rows;
}

// The round's query rows KV owner `o` serves: its own, then those that arrived.
std::vector<PackedRows> served_by(const CaseGrid& grid, const LogicalRank& o, const Range& span,
                                  const ExchangedRows& rows) {
  const int dim = grid.problem.dims.head_dim, batch = grid.problem.batch;
  std::vector<PackedRows> served;
  for (std::size_t t = 0; t < o.tokens.size(); ++t) {
    const Range part = intersection(o.tokens[t], span);
    if (!part.empty())
      served.push_back(PackedRows{&o, part, rows.own.at(o.id)[t].data(), batch, dim});
  }
  for (const Message& m : rows.inboxes.at(o.id).messages()) {
    served.push_back(PackedRows{&grid.ranks[static_cast<std::size_t>(m.header.src)],
                                m.header.tokens(), m.payload.data(), batch, dim});
  }
  return served;
}

// The CP rank owning the query block of `tokens` (a block of the grid).
int query_rank_of(const CaseGrid& grid, const Range& tokens) {
  for (const KvBlock& b : grid.blocks) {
    if (b.range.begin == tokens.begin) return b.owner_cp_rank;
  }
  throw std::logic_error("no grid block starts at " + std::to_string(tokens.begin));
}

// One round's block pairs: the units the backend runs and the partial-dq messages they fill.
struct RoundPairs {
  std::vector<BackwardUnit> units;
  std::vector<Message> partials;
};

// One head h of batch b against KV block `kb`: every query block of the round that sees it, in
// the served parts `parts[s]` (the round's rows of served range s; message_of[s]: its partial).
BackwardUnit head_unit(const CaseGrid& grid, const KvBlock& kb, int b, std::int64_t h,
                       const std::vector<PackedRows>& served, const std::vector<Range>& parts,
                       const std::map<std::size_t, std::size_t>& message_of, RoundPairs& round) {
  const int dim = grid.problem.dims.head_dim;
  BackwardUnit unit;
  unit.keys = kb.range;
  for (const auto& [s, msg] : message_of) {
    const PackedRows& rows = served[s];
    const Range& part = parts[s];
    float* dq_base = round.partials[msg].payload.data();
    for (const KvBlock& qb : blocks_in(grid, part)) {
      if (!causally_visible(kb.range, qb.range)) continue;
      const std::int64_t row = qb.range.begin - rows.tokens.begin;
      unit.blocks.push_back(QueryBlockRows{
          qb.range, rows.q(b, h, row), rows.d_out(b, h, row), rows.lse(b, h, row),
          rows.delta(b, h, row),
          dq_base + (rows.slot(b, h) * part.size() + (qb.range.begin - part.begin)) * dim});
    }
  }
  std::sort(unit.blocks.begin(), unit.blocks.end(),
            [](const QueryBlockRows& x, const QueryBlockRows& y) {
              return x.tokens.begin < y.tokens.begin;
            });
  return unit;
}

// A partial-dq message's payload ([B·heads][part][D]): the units write the rows of the query
// blocks that see the KV block, and only those are read where it is folded (fold_dq); the rows
// of the blocks before it are zeroed, so the message carries no stale bytes.
FloatBuffer partial_dq_buffer(const CaseGrid& grid, const KvBlock& kb, const Range& part,
                              const MessageHeader& h) {
  FloatBuffer dq = unwritten_floats(static_cast<std::size_t>(h.floats));
  const int dim = grid.problem.dims.head_dim;
  const std::int64_t slots = h.floats / (part.size() * dim);
  for (const KvBlock& qb : blocks_in(grid, part)) {
    if (causally_visible(kb.range, qb.range)) continue;
    for (std::int64_t slot = 0; slot < slots; ++slot) {
      float* rows = dq.data() + (slot * part.size() + (qb.range.begin - part.begin)) * dim;
      std::fill(rows, rows + qb.range.size() * dim, 0.0f);
    }
  }
  return dq;
}

// The round's block pairs of KV owner `o` (gradients grads[grad]; its K and V read in place from
// the input memo), for the round's rows it serves.
void add_round_pairs(const CaseGrid& grid, const LogicalRank& o, std::size_t grad,
                     InputStore& inputs, const std::vector<PackedRows>& served, KvTotals& totals,
                     RoundPairs& round) {
  const int group = grid.problem.dims.group_size();
  std::vector<Range> parts;
  for (const PackedRows& rows : served) parts.push_back(rows.tokens);
  for (const KvBlock& kb : grid.blocks_of(o.cp_rank)) {
    // One partial-dq message per served part that sees the block.
    std::map<std::size_t, std::size_t> message_of;  // served index → partials index
    for (std::size_t s = 0; s < served.size(); ++s) {
      if (parts[s].empty() || !causally_visible(kb.range, parts[s])) continue;
      const MessageHeader h = dq_partial_header(grid, *served[s].owner, parts[s], kb);
      message_of[s] = round.partials.size();
      round.partials.push_back(Message{h, partial_dq_buffer(grid, kb, parts[s], h)});
    }
    if (message_of.empty()) continue;
    for (int b = 0; b < grid.problem.batch; ++b) {
      for (std::int64_t g = o.kv_heads.begin; g < o.kv_heads.end; ++g) {
        KvTotals::Fold& f = totals.at(grad, b, g, kb.index);
        std::vector<bool> seen(f.lane_started.size(), false);  // lane ranks with blocks here
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
          BackwardUnit unit = head_unit(grid, kb, b, h, served, parts, message_of, round);
          const std::size_t head = static_cast<std::size_t>(h - g * group);
          const std::size_t x = f.first_total + 2 * head;
          unit.k = inputs.row(TensorId::k, b, g, kb.range.begin);
          unit.v = inputs.row(TensorId::v, b, g, kb.range.begin);
          unit.dk_total = totals.head_totals[x].data();
          unit.dv_total = totals.head_totals[x + 1].data();
          unit.accumulate = f.started;
          if (!seen.empty()) {  // the te_p2p lane: each query rank's blocks folded apart too
            std::vector<bool> opened(seen.size(), false);
            for (QueryBlockRows& qb : unit.blocks) {
              const int r = query_rank_of(grid, qb.tokens);
              const std::size_t lane = totals.lane_of(f, r, group, grid.problem.dims.head_dim);
              qb.dk_lane = totals.lane_totals[lane + 2 * head].data();
              qb.dv_lane = totals.lane_totals[lane + 2 * head + 1].data();
              qb.lane_first = !f.lane_started[static_cast<std::size_t>(r)] &&
                              !opened[static_cast<std::size_t>(r)];
              opened[static_cast<std::size_t>(r)] = true;
              seen[static_cast<std::size_t>(r)] = true;
            }
          }
          round.units.push_back(std::move(unit));
        }
        f.started = true;
        for (std::size_t r = 0; r < seen.size(); ++r) {
          if (seen[r]) f.lane_started[r] = true;
        }
      }
    }
  }
}

}  // namespace

std::vector<RankGradients> run_backward(const CaseGrid& grid,
                                        const std::vector<RankOutput>& forward,
                                        Transport& transport, InputStore& inputs,
                                        bool te_p2p_lane) {
  if (te_p2p_lane && !inputs.backend().has_lane_partials()) {
    throw std::logic_error(std::string("the ") + inputs.backend().name() +
                           " backend cannot run the te_p2p backward lane");
  }
  const Problem& p = grid.problem;
  const int dim = p.dims.head_dim, group = p.dims.group_size();
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  std::map<int, const RankOutput*> fwd;
  for (const RankOutput& o : forward) fwd[o.rank.id] = &o;

  std::vector<RankGradients> grads;
  KvTotals totals;
  for (const LogicalRank& o : hosted) {
    const ShardShape kv_shape{p.batch, o.kv_heads, o.tokens, dim};
    const ShardShape q_shape = query_shape(grid, o, dim);
    inputs.prepare(TensorId::q, q_shape);
    inputs.prepare(TensorId::d_out, q_shape);
    inputs.prepare(TensorId::k, kv_shape);
    inputs.prepare(TensorId::v, kv_shape);
    // Every row is written whole: dq by its query block's fold (a block always sees its own KV
    // block), dK and dV by their KV block's; the te_p2p lane's alike, as a step of each fold is
    // never skipped (a query block sees its own CP rank's blocks, a KV block its own queries).
    grads.push_back(RankGradients{o,
                                  Shard(q_shape, Uninitialized{}),
                                  Shard(kv_shape, Uninitialized{}),
                                  Shard(kv_shape, Uninitialized{}),
                                  {},
                                  {}});
    if (te_p2p_lane) {
      grads.back().te_p2p =
          LaneGradients{Shard(q_shape, Uninitialized{}), Shard(kv_shape, Uninitialized{}),
                        Shard(kv_shape, Uninitialized{})};
    }
    for (const KvBlock& kb : grid.blocks_of(o.cp_rank)) {
      for (int b = 0; b < p.batch; ++b) {
        for (std::int64_t g = o.kv_heads.begin; g < o.kv_heads.end; ++g)
          totals.add(grads.size() - 1, b, g, kb, group, dim, te_p2p_lane ? grid.spec.cp : 0);
      }
    }
  }
  // Rounds of query blocks in ascending order: the round's rows travel to the KV owners, whose
  // partial dq complete those rows' dq; dK and dV continue their fold over the query blocks
  // from round to round.
  for (const Range& span : grid.backward_rounds()) {
    const ExchangedRows rows = exchange_rows(grid, span, hosted, fwd, transport, inputs);
    RoundPairs round;
    for (std::size_t i = 0; i < hosted.size(); ++i) {
      add_round_pairs(grid, hosted[i], i, inputs, served_by(grid, hosted[i], span, rows), totals,
                      round);
    }
    inputs.backend().run_backward_units(round.units, dim, p.dims.softmax_scale());
    fold_dq(grid, span, std::move(round.partials), hosted, transport, inputs.pool(), grads);
  }
  fold_kv_gradients(grid, totals, inputs.pool(), grads);
  return grads;
}

}  // namespace cpd
