#include "engine/paged/paged_lanes.h"

#include <algorithm>

#include "engine/case_runner.h"
#include "kernels/input_store.h"

namespace cpd::paged {
namespace {

// A cache holding sequences `batch_rows` of `kv` (cache sequence s ← batch row batch_rows[s]).
PagedKvCache filled_cache(PageTable table, const LogicalKv& kv, Range heads,
                          const std::vector<int>& batch_rows) {
  PagedKvCache cache(std::move(table), heads, kv.k.shape.width);
  for (int s = 0; s < cache.table().sequences(); ++s) {
    const int b = batch_rows[static_cast<std::size_t>(s)];
    for (std::int64_t h = heads.begin; h < heads.end; ++h)
      cache.write_sequence(s, h, kv.k.at(b, h, 0), kv.v.at(b, h, 0));
  }
  return cache;
}

// The seed of the page layouts (allocator order, shuffle): fixed by the problem's seed.
std::uint64_t layout_seed(const Problem& p) { return p.seed ^ 0x5EEDBA5Eu; }

}  // namespace

Range kv_heads_of(const Problem& p, int tp, int world, int rank) {
  const std::int64_t kv = p.dims.num_kv_heads;
  const auto tp_heads = [&](std::int64_t t) { return Range{kv * t / tp, kv * (t + 1) / tp}; };
  if (world < tp) {  // this process hosts the TP ranks t with t·world/tp = rank
    std::int64_t first = -1, last = -1;
    for (std::int64_t t = 0; t < tp; ++t) {
      if (t * world / tp != rank) continue;
      if (first < 0) first = t;
      last = t;
    }
    return first < 0 ? Range{0, 0} : Range{tp_heads(first).begin, tp_heads(last).end};
  }
  // TP rank t's processes are [t·world/tp, (t+1)·world/tp) (rounded up at both ends: each
  // gets at least one); they split its heads as evenly as can be.
  for (std::int64_t t = 0; t < tp; ++t) {
    const std::int64_t begin = (t * world + tp - 1) / tp, end = ((t + 1) * world + tp - 1) / tp;
    if (rank < begin || rank >= end) continue;
    const Range heads = tp_heads(t);
    const std::int64_t n = std::min(end - begin, heads.size()), i = rank - begin;
    if (i >= n) return Range{0, 0};
    return Range{heads.begin + heads.size() * i / n, heads.begin + heads.size() * (i + 1) / n};
  }
  return Range{0, 0};
}

std::vector<int> head_owners(const Problem& p, int tp, int world) {
  std::vector<int> owner(static_cast<std::size_t>(p.dims.num_q_heads), 0);
  for (int r = 0; r < world; ++r) {
    const Range heads = kv_heads_of(p, tp, world, r);
    for (std::int64_t g = heads.begin; g < heads.end; ++g) {
      for (int x = 0; x < p.dims.group_size(); ++x)
        owner[static_cast<std::size_t>(g * p.dims.group_size() + x)] = r;
    }
  }
  return owner;
}

PagedInputs prepare_paged_inputs(const RunContext& ctx, const PagedWorkload& w, int tp) {
  const Problem& p = ctx.problem;
  const int group = p.dims.group_size();
  const InputPrecision precision =
      p.dtype == DType::bf16 ? InputPrecision::bf16 : InputPrecision::fp32;
  PagedInputs in;
  in.tp = tp;
  in.heads = kv_heads_of(p, tp, ctx.collectives.size(), ctx.collectives.rank());
  in.main_table = make_page_table(w.kv_lens, w.page_size, w.prefix_pages(), PageLayout::interleaved,
                                  layout_seed(p));
  if (in.heads.empty()) return in;
  const ShardShape q_shape{p.batch,
                           Range{in.heads.begin * group, in.heads.end * group},
                           {Range{0, p.seq_len}},
                           p.dims.head_dim};
  in.q = ctx.inputs.shard(TensorId::q, q_shape, precision);
  in.q32 = ctx.inputs.shard(TensorId::q, q_shape, InputPrecision::fp32);
  in.kv = logical_kv(w, ctx.inputs, in.heads, precision);
  in.kv32 = logical_kv(w, ctx.inputs, in.heads, InputPrecision::fp32);
  const Lane reference{PagedCall::paged_prefill, SplitKv{SplitPolicy::disabled, 0},
                       ProbRounding::none};
  AttentionBackend& backend = ctx.inputs.backend();
  const float scale = p.dims.softmax_scale();
  in.reference =
      run_contiguous_lane(reference, w, in.kv.k, in.kv.v, in.q, in.heads, group, scale, backend);
  in.reference_fp32 = run_contiguous_lane(reference, w, in.kv32.k, in.kv32.v, in.q32, in.heads,
                                          group, scale, backend);
  in.reference_cast = final_write(in.reference, p.dtype == DType::bf16, ctx.pool);
  return in;
}

PlanLanes compute_plan_lanes(const RunContext& ctx, const PagedWorkload& w, const PagedInputs& in,
                             const SplitKv& split, const std::vector<PagedMode>& modes) {
  const Problem& p = ctx.problem;
  const int group = p.dims.group_size();
  const float scale = p.dims.softmax_scale();
  const ProbRounding rounding = p.dtype == DType::bf16 ? ProbRounding::bf16 : ProbRounding::none;
  AttentionBackend& backend = ctx.inputs.backend();
  const Range heads = in.heads;

  PlanLanes l;
  l.split = split;
  for (const PagedMode m : modes) {  // present, if empty
    l.permuted[m];
    l.private_prefix[m];
    l.fp32[m];
    l.alone[m];
  }
  if (heads.empty()) return l;
  std::vector<int> rows(static_cast<std::size_t>(w.sequences()));
  for (int b = 0; b < w.sequences(); ++b) rows[static_cast<std::size_t>(b)] = b;
  const auto lane = [&](PagedCall call, ProbRounding r) { return Lane{call, split, r}; };
  const auto call_of = [](PagedMode m) {
    return m == PagedMode::decode ? PagedCall::decode : PagedCall::paged_prefill;
  };
  const auto run = [&](const Lane& ln, const PagedKvCache& cache, const Shard& q,
                       const std::vector<int>& batch_rows,
                       std::vector<std::vector<Range>>* plans_used = nullptr) {
    return run_paged_lane(ln, cache, w.q_len, q, batch_rows, heads, group, scale, backend,
                          plans_used);
  };
  {
    const PagedKvCache main = filled_cache(in.main_table, in.kv, heads, rows);
    l.decode = run(lane(PagedCall::decode, rounding), main, in.q, rows, &l.decode_plans);
    l.paged_prefill =
        run(lane(PagedCall::paged_prefill, rounding), main, in.q, rows, &l.paged_prefill_plans);
    l.full_prefill = run(lane(PagedCall::full_prefill, rounding), main, in.q, rows);
  }
  l.chunked = run_contiguous_lane(lane(PagedCall::chunked_prefill, rounding), w, in.kv.k, in.kv.v,
                                  in.q, heads, group, scale, backend);
  for (const PageLayout layout : {PageLayout::permuted, PageLayout::private_prefix}) {
    const PagedKvCache cache = filled_cache(
        make_page_table(w.kv_lens, w.page_size, w.prefix_pages(), layout, layout_seed(p)), in.kv,
        heads, rows);
    for (const PagedMode m : modes) {
      (layout == PageLayout::permuted ? l.permuted : l.private_prefix)[m] =
          run(lane(call_of(m), rounding), cache, in.q, rows);
    }
  }
  {
    const PagedKvCache main32 = filled_cache(in.main_table, in.kv32, heads, rows);
    for (const PagedMode m : modes) {
      l.fp32[m] = run(lane(call_of(m), ProbRounding::none), main32, in.q32, rows);
    }
  }
  for (int b = 0; b < w.sequences(); ++b) {
    // Sequence b alone: a one-sequence cache of its own (its prompt pages private), batch 1.
    const std::vector<int> only{b};
    const PagedKvCache cache =
        filled_cache(make_page_table({w.kv_lens[static_cast<std::size_t>(b)]}, w.page_size, 0,
                                     PageLayout::interleaved, layout_seed(p)),
                     in.kv, heads, only);
    for (const PagedMode m : modes) {
      l.alone[m].push_back(run(lane(call_of(m), rounding), cache, in.q, only));
    }
  }
  return l;
}

}  // namespace cpd::paged
