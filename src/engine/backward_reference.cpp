// The CP=1 reference backward, computed by whoever needs it from regenerated inputs: one block
// pair [0, S) × [0, S), from the CP=1 FP32 forward.
#include <algorithm>

#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/cpu/attention_backward.h"
#include "cpdrift/engine/backward.h"
#include "cpdrift/numerics/attention_backward_math.h"

namespace cpd {
namespace {}  // namespace

LocalCp1Backward::Result LocalCp1Backward::get(InputStore& inputs, LocalCp1Results& forward,
                                               const ShardShape& q_rows,
                                               const ShardShape& kv_rows) {
  const Problem& p = inputs.problem();
  const int dim = p.dims.head_dim, group = p.dims.group_size(), batch = p.batch;
  const std::int64_t seq = p.seq_len;
  std::int64_t first = seq;
  for (const Range& t : q_rows.tokens) first = std::min(first, t.begin);
  for (const Range& t : kv_rows.tokens) first = std::min(first, t.begin);

  const auto found = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
    return e.q_heads.contains(q_rows.heads) && e.first <= first;
  });
  const Entry* entry = found != entries_.end() ? &*found : nullptr;
  if (entry == nullptr) {
    // Rows [first, S) against keys [0, S): the dq of those rows is complete (rows are
    // independent), and so are the dk, dv of keys from `first` on (earlier rows cannot see them).
    const Range heads = q_rows.heads, kv_heads{heads.begin / group, heads.end / group};
    const Range rows{first, seq}, keys{0, seq};
    const ShardShape qs{batch, heads, {rows}, dim}, kvs{batch, kv_heads, {keys}, dim};
    const Shard q = inputs.shard(TensorId::q, qs, InputPrecision::fp32);
    const Shard d_out = inputs.shard(TensorId::d_out, qs, InputPrecision::fp32);
    const Shard k = inputs.shard(TensorId::k, kvs, InputPrecision::fp32);
    const Shard v = inputs.shard(TensorId::v, kvs, InputPrecision::fp32);
    const AttnShard fwd = forward.get(inputs, PathSpec{}, {keys}, qs);
    Shard delta(ShardShape{batch, heads, {rows}, 1});
    for (std::size_t r = 0; r < delta.data.size(); ++r) {
      delta.data[r] =
          backward_delta(d_out.data.data() + r * dim, fwd.out.data.data() + r * dim, dim);
    }
    Entry e{heads, first, Shard(qs), Shard(ShardShape{batch, kv_heads, {rows}, dim}),
            Shard(ShardShape{batch, kv_heads, {rows}, dim})};
    const float scale = p.dims.softmax_scale();
    const std::size_t n = static_cast<std::size_t>(rows.size()) * dim,
                      skip = static_cast<std::size_t>(first) * dim;
    // A few GQA groups at a time (enough units for every thread): their heads' dk, dv over all
    // keys, then each group's fold; only those groups' totals are alive at once.
    struct Group {
      int b;
      std::int64_t g;
    };
    std::vector<Group> groups;
    for (int b = 0; b < batch; ++b) {
      for (std::int64_t g = kv_heads.begin; g < kv_heads.end; ++g) groups.push_back(Group{b, g});
    }
    const std::size_t per_call = std::max<std::size_t>(
        1, (static_cast<std::size_t>(inputs.pool().size()) + group - 1) / group);
    std::vector<std::vector<float>> totals(2 * per_call * group,
                                           std::vector<float>(static_cast<std::size_t>(seq) * dim));
    for (std::size_t first_group = 0; first_group < groups.size(); first_group += per_call) {
      const std::size_t count = std::min(per_call, groups.size() - first_group);
      std::vector<BackwardUnit> units;
      for (std::size_t i = 0; i < count; ++i) {
        const Group& gr = groups[first_group + i];
        for (int x = 0; x < group; ++x) {
          const std::int64_t h = gr.g * group + x;
          const std::size_t slot = 2 * (i * group + static_cast<std::size_t>(x));
          BackwardUnit u;
          u.blocks.push_back(QueryBlockRows{rows, q.at(gr.b, h, 0), d_out.at(gr.b, h, 0),
                                            fwd.lse.at(gr.b, h, 0), delta.at(gr.b, h, 0),
                                            e.dq.at(gr.b, h, 0)});
          u.k = k.at(gr.b, gr.g, 0);
          u.v = v.at(gr.b, gr.g, 0);
          u.keys = keys;
          u.dk_total = totals[slot].data();
          u.dv_total = totals[slot + 1].data();
          units.push_back(std::move(u));
        }
      }
      inputs.backend().run_backward_units(units, dim, scale);
      for (std::size_t i = 0; i < count; ++i) {
        const Group& gr = groups[first_group + i];
        std::vector<const float*> dk_terms, dv_terms;
        for (int x = 0; x < group; ++x) {
          const std::size_t slot = 2 * (i * group + static_cast<std::size_t>(x));
          dk_terms.push_back(totals[slot].data() + skip);
          dv_terms.push_back(totals[slot + 1].data() + skip);
        }
        float* dk = e.dk.at(gr.b, gr.g, 0);
        fold_terms(dk_terms, n, dk);
        for (std::size_t j = 0; j < n; ++j) dk[j] *= scale;
        fold_terms(dv_terms, n, e.dv.at(gr.b, gr.g, 0));
      }
    }
    for (float& x : e.dq.data) x *= scale;  // one block: the fold of one term is the term
    entries_.push_back(std::move(e));
    entry = &entries_.back();
  }
  Result r{Shard(ShardShape{q_rows.batch, q_rows.heads, q_rows.tokens, dim}),
           Shard(ShardShape{kv_rows.batch, kv_rows.heads, kv_rows.tokens, dim}),
           Shard(ShardShape{kv_rows.batch, kv_rows.heads, kv_rows.tokens, dim})};
  for (const Range& t : q_rows.tokens) copy_rows(entry->dq, r.dq, r.dq.shape.heads, t);
  for (const Range& t : kv_rows.tokens) {
    copy_rows(entry->dk, r.dk, r.dk.shape.heads, t);
    copy_rows(entry->dv, r.dv, r.dv.shape.heads, t);
  }
  return r;
}

}  // namespace cpd
