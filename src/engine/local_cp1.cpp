#include "engine/local_cp1.h"

#include <algorithm>

#include "kernels/attention_backend.h"
#include "kernels/cpu/attention.h"

namespace cpd {

AttnShard compute_local_cp1(InputStore& inputs, const PathSpec& path,
                            const std::vector<Range>& grid, const ShardShape& rows) {
  const Problem& problem = inputs.problem();
  const int dim = problem.dims.head_dim, group = problem.dims.group_size();
  std::int64_t kv_end = 0;
  for (const Range& t : rows.tokens) kv_end = std::max(kv_end, t.end);
  const Range kv_heads{rows.heads.begin / group, (rows.heads.end - 1) / group + 1};
  const ShardShape qs{rows.batch, rows.heads, rows.tokens, dim};
  const ShardShape kvs{rows.batch, kv_heads, {Range{0, kv_end}}, dim};
  // FP32 inputs are read in place from the memo; BF16 ones are rounded copies.
  const bool in_place = path.inputs == InputPrecision::fp32;
  Shard q, k, v;
  if (in_place) {
    inputs.prepare(TensorId::q, qs);
    inputs.prepare(TensorId::k, kvs);
    inputs.prepare(TensorId::v, kvs);
  } else {
    q = inputs.shard(TensorId::q, qs, path.inputs);
    k = inputs.shard(TensorId::k, kvs, path.inputs);
    v = inputs.shard(TensorId::v, kvs, path.inputs);
  }
  const auto at = [&](TensorId t, const Shard& copy, int b, std::int64_t h, std::int64_t pos) {
    return in_place ? inputs.row(t, b, h, pos) : copy.at(b, h, copy.shape.local_row(pos));
  };

  // Unwritten: a fold job per (batch, head, token range) writes each row.
  AttnShard result = AttnShard::unwritten(qs);
  std::vector<FoldJob> jobs;
  for (int b = 0; b < rows.batch; ++b) {
    for (std::int64_t h = rows.heads.begin; h < rows.heads.end; ++h) {
      for (const Range& t : rows.tokens) {
        const std::int64_t row = qs.local_row(t.begin);
        jobs.push_back(FoldJob{at(TensorId::q, q, b, h, t.begin), t.begin, t.size(),
                               at(TensorId::k, k, b, h / group, 0),
                               at(TensorId::v, v, b, h / group, 0), 0, grid,
                               result.out.at(b, h, row), result.lse.at(b, h, row)});
      }
    }
  }
  inputs.backend().run_fold_jobs(jobs, dim, problem.dims.softmax_scale(), path.rounding);
  return result;
}

namespace {

// Copies rows [tokens] of heads [heads], out and lse, from `from` into `to`: a head a task on
// the pool.
void copy_rows(const AttnShard& from, AttnShard& to, const Range& heads, const Range& tokens,
               ThreadPool& pool) {
  pool.parallel_for(heads.size(), [&](std::int64_t i) {
    const Range head{heads.begin + i, heads.begin + i + 1};
    cpd::copy_rows(from.out, to.out, head, tokens);
    cpd::copy_rows(from.lse, to.lse, head, tokens);
  });
}

}  // namespace

AttnShard LocalCp1Results::get(InputStore& inputs, const PathSpec& path,
                               const std::vector<Range>& grid, const ShardShape& rows) {
  const int dim = inputs.problem().dims.head_dim;
  const ShardShape out{rows.batch, rows.heads, rows.tokens, dim};
  std::vector<Entry>& entries =
      entries_[Key{static_cast<int>(path.inputs), static_cast<int>(path.rounding), grid}];
  const auto find = [&](const Range& t) -> const Entry* {
    for (const Entry& e : entries) {
      if (e.heads.contains(rows.heads) && e.tokens.contains(t) &&
          e.data.out.shape.batch == rows.batch) {
        return &e;
      }
    }
    return nullptr;
  };
  std::vector<Range> missing;
  for (const Range& t : rows.tokens) {
    if (find(t) == nullptr) missing.push_back(t);
  }
  AttnShard fresh;
  if (!missing.empty()) {
    fresh = compute_local_cp1(inputs, path, grid, ShardShape{rows.batch, rows.heads, missing, dim});
    const std::size_t bytes = (fresh.out.data.size() + fresh.lse.data.size()) * sizeof(float);
    if (held_bytes_ + bytes <= budget_bytes_) {
      held_bytes_ += bytes;
      for (const Range& t : missing) {
        Entry e{rows.heads, t, AttnShard::unwritten(ShardShape{rows.batch, rows.heads, {t}, dim})};
        copy_rows(fresh, e.data, rows.heads, t, inputs.pool());
        entries.push_back(std::move(e));
      }
    } else if (missing.size() == rows.tokens.size()) {
      return fresh;  // nothing memoised: as computed
    }
  }
  // Each range from the memo, or else fresh.
  AttnShard result = AttnShard::unwritten(out);
  for (const Range& t : rows.tokens) {
    const Entry* e = find(t);
    copy_rows(e != nullptr ? e->data : fresh, result, rows.heads, t, inputs.pool());
  }
  return result;
}

}  // namespace cpd
