// The distributed backward: query rows to the KV owners, block pairs there, partial dq back.
#include "cpdrift/engine/backward.h"

#include <algorithm>
#include <cstring>

#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/cpu/attention_backward.h"
#include "cpdrift/numerics/attention_backward_math.h"
#include "protocol_common.h"

namespace cpd {
namespace {

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

std::vector<float> pack_rows(const Shard& q, const Shard& d_out, const AttnShard& fwd,
                             const Range& tokens, int dim) {
  std::vector<float> payload = protocol::rows_of(q, tokens);
  const std::vector<float> o = protocol::rows_of(d_out, tokens);
  payload.insert(payload.end(), o.begin(), o.end());
  const std::vector<float> lse = protocol::rows_of(fwd.lse, tokens);
  payload.insert(payload.end(), lse.begin(), lse.end());
  const std::vector<float> outs = protocol::rows_of(fwd.out, tokens);
  for (std::size_t r = 0; r < lse.size(); ++r) {
    payload.push_back(backward_delta(o.data() + r * dim, outs.data() + r * dim, dim));
  }
  return payload;
}

// The grid's query blocks inside `tokens` (blocks are cut from owner ranges, so each lies in
// exactly one range).
std::vector<KvBlock> blocks_in(const CaseGrid& grid, const Range& tokens) {
  std::vector<KvBlock> out;
  for (const KvBlock& b : grid.blocks) {
    if (tokens.contains(b.range)) out.push_back(b);
  }
  return out;
}

// Superstep 1: every hosted rank's query ranges, packed (q, dO, lse, Δ), to the owners of the
// KV blocks they see. `own[id][t]`: hosted rank id's token range t; `inboxes`: what arrived.
struct ExchangedRows {
  std::map<int, std::vector<std::vector<float>>> own;
  std::map<int, Inbox> inboxes;
};

ExchangedRows exchange_rows(const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
                            const std::vector<RankOutput>& forward, Transport& transport,
                            InputStore& inputs) {
  const int dim = grid.problem.dims.head_dim;
  std::map<int, const RankOutput*> fwd;
  for (const RankOutput& o : forward) fwd[o.rank.id] = &o;
  ExchangedRows rows;
  for (const LogicalRank& r : hosted) {
    const ShardShape shape = query_shape(grid, r, dim);
    const Shard q = inputs.shard(TensorId::q, shape, InputPrecision::fp32);
    const Shard d_out = inputs.shard(TensorId::d_out, shape, InputPrecision::fp32);
    for (const Range& t : r.tokens)
      rows.own[r.id].push_back(pack_rows(q, d_out, fwd.at(r.id)->merged, t, dim));
  }
  std::vector<Message> outgoing;
  for (const LogicalRank& dst : grid.ranks) {
    for (const MessageHeader& h : expected_backward_rows(grid, dst)) {
      if (rows.own.count(h.src) == 0) continue;
      const LogicalRank& src = grid.ranks[static_cast<std::size_t>(h.src)];
      const auto at =
          std::find(src.tokens.begin(), src.tokens.end(), h.tokens()) - src.tokens.begin();
      outgoing.push_back(Message{h, rows.own.at(h.src)[static_cast<std::size_t>(at)]});
    }
  }
  rows.inboxes =
      protocol::superstep(transport, hosted, std::move(outgoing),
                          [&](const LogicalRank& r) { return expected_backward_rows(grid, r); });
  return rows;
}

// The query ranges KV owner `o` serves: its own, then those that arrived.
std::vector<PackedRows> served_by(const CaseGrid& grid, const LogicalRank& o,
                                  const ExchangedRows& rows) {
  const int dim = grid.problem.dims.head_dim, batch = grid.problem.batch;
  std::vector<PackedRows> served;
  for (std::size_t t = 0; t < o.tokens.size(); ++t)
    served.push_back(PackedRows{&o, o.tokens[t], rows.own.at(o.id)[t].data(), batch, dim});
  for (const Message& m : rows.inboxes.at(o.id).messages()) {
    served.push_back(PackedRows{&grid.ranks[static_cast<std::size_t>(m.header.src)],
                                m.header.tokens(), m.payload.data(), batch, dim});
  }
  return served;
}

// Every block pair of the hosted KV owners: the units the backend runs, the partial-dq messages
// they fill, and the per-head dK/dV totals that the GQA fold then sums.
struct BlockPairs {
  std::vector<BackwardUnit> units;
  std::vector<Message> partials;
  std::vector<std::vector<float>> head_totals;  // inner buffers stay put as this grows
  // dK, dV of one (owner, b, KV head g, block): the group's head totals from `first_total`
  // (dk, dv per head).
  struct Fold {
    std::size_t grad;  // index into the gradients
    int b;
    std::int64_t g;
    KvBlock block;
    std::size_t first_total;
  };
  std::vector<Fold> folds;
};

// One head h of batch b against KV block `kb`: every served query block that sees it.
BackwardUnit head_unit(const CaseGrid& grid, const KvBlock& kb, int b, std::int64_t h,
                       const std::vector<PackedRows>& served,
                       const std::map<std::size_t, std::size_t>& message_of, BlockPairs& pairs) {
  const int dim = grid.problem.dims.head_dim;
  BackwardUnit unit;
  unit.keys = kb.range;
  for (const auto& [s, msg] : message_of) {
    const PackedRows& rows = served[s];
    float* dq_base = pairs.partials[msg].payload.data();
    for (const KvBlock& qb : blocks_in(grid, rows.tokens)) {
      if (!causally_visible(kb.range, qb.range)) continue;
      const std::int64_t row = qb.range.begin - rows.tokens.begin;
      unit.blocks.push_back(QueryBlockRows{
          qb.range, rows.q(b, h, row), rows.d_out(b, h, row), rows.lse(b, h, row),
          rows.delta(b, h, row), dq_base + (rows.slot(b, h) * rows.tokens.size() + row) * dim});
    }
  }
  std::sort(unit.blocks.begin(), unit.blocks.end(),
            [](const QueryBlockRows& x, const QueryBlockRows& y) {
              return x.tokens.begin < y.tokens.begin;
            });
  return unit;
}

// The block pairs of KV owner `o` (gradients grads[grad]; its K, V), for every query range it
// serves.
void add_block_pairs(const CaseGrid& grid, const LogicalRank& o, std::size_t grad, const Shard& k,
                     const Shard& v, const std::vector<PackedRows>& served, BlockPairs& pairs) {
  const int dim = grid.problem.dims.head_dim, group = grid.problem.dims.group_size();
  for (const KvBlock& kb : grid.blocks_of(o.cp_rank)) {
    // One partial-dq message per served range that sees the block.
    std::map<std::size_t, std::size_t> message_of;  // served index → partials index
    for (std::size_t s = 0; s < served.size(); ++s) {
      if (!causally_visible(kb.range, served[s].tokens)) continue;
      const MessageHeader h = dq_partial_header(grid, *served[s].owner, served[s].tokens, kb);
      message_of[s] = pairs.partials.size();
      pairs.partials.push_back(
          Message{h, std::vector<float>(static_cast<std::size_t>(h.floats), 0.0f)});
    }
    const std::int64_t kv_row = k.shape.local_row(kb.range.begin);
    const std::size_t n = static_cast<std::size_t>(kb.range.size()) * dim;
    for (int b = 0; b < grid.problem.batch; ++b) {
      for (std::int64_t g = o.kv_heads.begin; g < o.kv_heads.end; ++g) {
        pairs.folds.push_back(BlockPairs::Fold{grad, b, g, kb, pairs.head_totals.size()});
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
          BackwardUnit unit = head_unit(grid, kb, b, h, served, message_of, pairs);
          unit.k = k.at(b, g, kv_row);
          unit.v = v.at(b, g, kv_row);
          unit.dk_total = pairs.head_totals.emplace_back(n).data();
          unit.dv_total = pairs.head_totals.emplace_back(n).data();
          pairs.units.push_back(std::move(unit));
        }
      }
    }
  }
}

// dK, dV: the GQA group's heads folded in ascending order; dK carries the scale.
void fold_kv_gradients(const CaseGrid& grid, const BlockPairs& pairs,
                       std::vector<RankGradients>& grads) {
  const int dim = grid.problem.dims.head_dim, group = grid.problem.dims.group_size();
  const float scale = grid.problem.dims.softmax_scale();
  for (const BlockPairs::Fold& f : pairs.folds) {
    RankGradients& rg = grads[f.grad];
    const std::size_t n = static_cast<std::size_t>(f.block.range.size()) * dim;
    std::vector<const float*> dk_terms, dv_terms;
    for (int x = 0; x < group; ++x) {
      dk_terms.push_back(pairs.head_totals[f.first_total + 2 * x].data());
      dv_terms.push_back(pairs.head_totals[f.first_total + 2 * x + 1].data());
    }
    const std::int64_t row = rg.dk.shape.local_row(f.block.range.begin);
    float* dk = rg.dk.at(f.b, f.g, row);
    fold_terms(dk_terms, n, dk);
    for (std::size_t i = 0; i < n; ++i) dk[i] *= scale;
    fold_terms(dv_terms, n, rg.dv.at(f.b, f.g, row));
  }
}

// dq of one query block qb of range t (rank r): the partials of the blocks it saw, in ascending
// block order, then the scale.
void fold_dq_block(const CaseGrid& grid, RankGradients& rg, const Range& t, const KvBlock& qb,
                   const std::vector<const Message*>& terms) {
  const LogicalRank& r = rg.rank;
  const int dim = grid.problem.dims.head_dim;
  const float scale = grid.problem.dims.softmax_scale();
  const std::int64_t row = qb.range.begin - t.begin, rows = t.size(), heads = r.q_heads.size();
  const std::size_t n = static_cast<std::size_t>(qb.range.size()) * dim;
  std::vector<const float*> ptrs;
  for (int b = 0; b < grid.problem.batch; ++b) {
    for (std::int64_t h = r.q_heads.begin; h < r.q_heads.end; ++h) {
      ptrs.clear();
      const std::int64_t slot = b * heads + (h - r.q_heads.begin);
      for (const Message* m : terms) ptrs.push_back(m->payload.data() + (slot * rows + row) * dim);
      float* dq = rg.dq.at(b, h, rg.dq.shape.local_row(qb.range.begin));
      fold_terms(ptrs, n, dq);
      for (std::size_t i = 0; i < n; ++i) dq[i] *= scale;
    }
  }
}

// Superstep 2: the partial dq to the query owners, folded there in block order.
void fold_dq(const CaseGrid& grid, std::vector<Message> partials,
             const std::vector<LogicalRank>& hosted, Transport& transport,
             std::vector<RankGradients>& grads) {
  std::map<int, Inbox> dq_inboxes =
      protocol::superstep(transport, hosted, std::move(partials),
                          [&](const LogicalRank& r) { return expected_dq_partials(grid, r); });
  for (RankGradients& rg : grads) {
    const std::vector<Message>& arrived = dq_inboxes.at(rg.rank.id).messages();
    for (const Message& m : arrived) rg.dq_partials.push_back(m.header);
    for (const Range& t : rg.rank.tokens) {
      for (const KvBlock& qb : blocks_in(grid, t)) {
        std::vector<const Message*> terms;  // manifest order: ascending block index
        for (const Message& m : arrived) {
          if (m.header.tokens() == t && causally_visible(m.header.block(), qb.range))
            terms.push_back(&m);
        }
        fold_dq_block(grid, rg, t, qb, terms);
      }
    }
  }
}

}  // namespace

std::vector<RankGradients> run_backward(const CaseGrid& grid,
                                        const std::vector<RankOutput>& forward,
                                        Transport& transport, InputStore& inputs) {
  const Problem& p = grid.problem;
  const int dim = p.dims.head_dim;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const ExchangedRows rows = exchange_rows(grid, hosted, forward, transport, inputs);

  std::vector<RankGradients> grads;
  std::vector<Shard> k_shards, v_shards;  // alive until the units ran
  k_shards.reserve(hosted.size());
  v_shards.reserve(hosted.size());
  BlockPairs pairs;
  for (const LogicalRank& o : hosted) {
    const ShardShape kv_shape{p.batch, o.kv_heads, o.tokens, dim};
    k_shards.push_back(inputs.shard(TensorId::k, kv_shape, InputPrecision::fp32));
    v_shards.push_back(inputs.shard(TensorId::v, kv_shape, InputPrecision::fp32));
    grads.push_back(
        RankGradients{o, Shard(query_shape(grid, o, dim)), Shard(kv_shape), Shard(kv_shape), {}});
    add_block_pairs(grid, o, grads.size() - 1, k_shards.back(), v_shards.back(),
                    served_by(grid, o, rows), pairs);
  }
  inputs.backend().run_backward_units(pairs.units, dim, p.dims.softmax_scale());
  fold_kv_gradients(grid, pairs, grads);
  fold_dq(grid, std::move(pairs.partials), hosted, transport, grads);
  return grads;
}

}  // namespace cpd
