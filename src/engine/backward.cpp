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

}  // namespace

std::vector<RankGradients> run_backward(const CaseGrid& grid,
                                        const std::vector<RankOutput>& forward,
                                        Transport& transport, InputStore& inputs) {
  const Problem& p = grid.problem;
  const int dim = p.dims.head_dim, batch = p.batch, group = p.dims.group_size();
  const float scale = p.dims.softmax_scale();
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  std::map<int, const RankOutput*> fwd;
  for (const RankOutput& o : forward) fwd[o.rank.id] = &o;

  // Superstep 1: every query range's (q, dO, lse, Δ) to the owners of the blocks it sees.
  std::map<int, std::vector<std::vector<float>>> own_packed;  // per hosted rank, per token range
  for (const LogicalRank& r : hosted) {
    const ShardShape shape = query_shape(grid, r, dim);
    const Shard q = inputs.shard(TensorId::q, shape, InputPrecision::fp32);
    const Shard d_out = inputs.shard(TensorId::d_out, shape, InputPrecision::fp32);
    for (const Range& t : r.tokens)
      own_packed[r.id].push_back(pack_rows(q, d_out, fwd.at(r.id)->merged, t, dim));
  }
  std::vector<Message> outgoing;
  for (const LogicalRank& dst : grid.ranks) {
    for (const MessageHeader& h : expected_backward_rows(grid, dst)) {
      if (own_packed.count(h.src) == 0) continue;
      const LogicalRank& src = grid.ranks[static_cast<std::size_t>(h.src)];
      const auto at =
          std::find(src.tokens.begin(), src.tokens.end(), h.tokens()) - src.tokens.begin();
      outgoing.push_back(Message{h, own_packed.at(h.src)[static_cast<std::size_t>(at)]});
    }
  }
  std::map<int, Inbox> row_inboxes =
      protocol::superstep(transport, hosted, std::move(outgoing),
                          [&](const LogicalRank& r) { return expected_backward_rows(grid, r); });

  // Every block pair at the KV owners.
  std::vector<RankGradients> grads;
  std::vector<Message> partials;
  std::vector<BackwardUnit> units;
  // dk, dv per (owner, b, h, block), folded below; the inner buffers stay put as this grows.
  std::vector<std::vector<float>> head_totals;
  struct Fold {
    std::size_t grad;  // index into grads
    int b;
    std::int64_t g;
    KvBlock block;
    std::size_t first_total;  // head_totals index of the group's first head's dk (dv follows)
  };
  std::vector<Fold> folds;
  std::vector<Shard> k_shards, v_shards;
  k_shards.reserve(hosted.size());
  v_shards.reserve(hosted.size());
  for (const LogicalRank& o : hosted) {
    const ShardShape kv_shape{batch, o.kv_heads, o.tokens, dim};
    k_shards.push_back(inputs.shard(TensorId::k, kv_shape, InputPrecision::fp32));
    v_shards.push_back(inputs.shard(TensorId::v, kv_shape, InputPrecision::fp32));
    grads.push_back(
        RankGradients{o, Shard(query_shape(grid, o, dim)), Shard(kv_shape), Shard(kv_shape), {}});
    const Shard& k = k_shards.back();
    const Shard& v = v_shards.back();
    std::vector<PackedRows> served;
    for (std::size_t t = 0; t < o.tokens.size(); ++t) {
      served.push_back(PackedRows{&o, o.tokens[t], own_packed.at(o.id)[t].data(), batch, dim});
    }
    for (const Message& m : row_inboxes.at(o.id).messages()) {
      served.push_back(PackedRows{&grid.ranks[static_cast<std::size_t>(m.header.src)],
                                  m.header.tokens(), m.payload.data(), batch, dim});
    }
    for (const KvBlock& kb : grid.blocks_of(o.cp_rank)) {
      // One partial-dq message per served range that sees the block.
      std::map<std::size_t, std::size_t> message_of;  // served index → partials index
      for (std::size_t s = 0; s < served.size(); ++s) {
        if (!causally_visible(kb.range, served[s].tokens)) continue;
        const MessageHeader h = dq_partial_header(grid, *served[s].owner, served[s].tokens, kb);
        message_of[s] = partials.size();
        partials.push_back(
            Message{h, std::vector<float>(static_cast<std::size_t>(h.floats), 0.0f)});
      }
      const std::int64_t kv_row = k.shape.local_row(kb.range.begin);
      for (int b = 0; b < batch; ++b) {
        for (std::int64_t g = o.kv_heads.begin; g < o.kv_heads.end; ++g) {
          folds.push_back(Fold{grads.size() - 1, b, g, kb, head_totals.size()});
          for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
            const std::size_t n = static_cast<std::size_t>(kb.range.size()) * dim;
            head_totals.emplace_back(n);
            head_totals.emplace_back(n);
            BackwardUnit unit;
            unit.k = k.at(b, g, kv_row);
            unit.v = v.at(b, g, kv_row);
            unit.keys = kb.range;
            unit.dk_total = head_totals[head_totals.size() - 2].data();
            unit.dv_total = head_totals.back().data();
            for (const auto& [s, msg] : message_of) {
              const PackedRows& rows = served[s];
              float* dq_base = partials[msg].payload.data();
              for (const KvBlock& qb : blocks_in(grid, rows.tokens)) {
                if (!causally_visible(kb.range, qb.range)) continue;
                const std::int64_t row = qb.range.begin - rows.tokens.begin;
                unit.blocks.push_back(
                    QueryBlockRows{qb.range, rows.q(b, h, row), rows.d_out(b, h, row),
                                   rows.lse(b, h, row), rows.delta(b, h, row),
                                   dq_base + (rows.slot(b, h) * rows.tokens.size() + row) * dim});
              }
            }
            std::sort(unit.blocks.begin(), unit.blocks.end(),
                      [](const QueryBlockRows& x, const QueryBlockRows& y) {
                        return x.tokens.begin < y.tokens.begin;
                      });
            units.push_back(std::move(unit));
          }
        }
      }
    }
  }
  inputs.backend().run_backward_units(units, dim, scale);

  // dK, dV: fold the GQA group's heads in ascending order; dK carries the scale.
  for (const Fold& f : folds) {
    RankGradients& rg = grads[f.grad];
    const std::size_t n = static_cast<std::size_t>(f.block.range.size()) * dim;
    std::vector<const float*> dk_terms, dv_terms;
    for (int x = 0; x < group; ++x) {
      dk_terms.push_back(head_totals[f.first_total + 2 * x].data());
      dv_terms.push_back(head_totals[f.first_total + 2 * x + 1].data());
    }
    const std::int64_t row = rg.dk.shape.local_row(f.block.range.begin);
    float* dk = rg.dk.at(f.b, f.g, row);
    fold_terms(dk_terms, n, dk);
    for (std::size_t i = 0; i < n; ++i) dk[i] *= scale;
    fold_terms(dv_terms, n, rg.dv.at(f.b, f.g, row));
  }

  // Superstep 2: partial dq to the query owners, folded there in block order.
  std::map<int, Inbox> dq_inboxes =
      protocol::superstep(transport, hosted, std::move(partials),
                          [&](const LogicalRank& r) { return expected_dq_partials(grid, r); });
  for (RankGradients& rg : grads) {
    const LogicalRank& r = rg.rank;
    const std::vector<Message>& arrived = dq_inboxes.at(r.id).messages();
    for (const Message& m : arrived) rg.dq_partials.push_back(m.header);
    for (const Range& t : r.tokens) {
      for (const KvBlock& qb : blocks_in(grid, t)) {
        std::vector<const Message*> terms;  // manifest order: ascending block index
        for (const Message& m : arrived) {
          if (m.header.tokens() == t && causally_visible(m.header.block(), qb.range))
            terms.push_back(&m);
        }
        const std::int64_t row = qb.range.begin - t.begin, rows = t.size(),
                           heads = r.q_heads.size();
        const std::size_t n = static_cast<std::size_t>(qb.range.size()) * dim;
        for (int b = 0; b < batch; ++b) {
          for (std::int64_t h = r.q_heads.begin; h < r.q_heads.end; ++h) {
            std::vector<const float*> ptrs;
            const std::int64_t slot = b * heads + (h - r.q_heads.begin);
            for (const Message* m : terms)
              ptrs.push_back(m->payload.data() + (slot * rows + row) * dim);
            float* dq = rg.dq.at(b, h, rg.dq.shape.local_row(qb.range.begin));
            fold_terms(ptrs, n, dq);
            for (std::size_t i = 0; i < n; ++i) dq[i] *= scale;
          }
        }
      }
    }
  }
  return grads;
}

}  // namespace cpd
