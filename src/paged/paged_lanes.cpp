#include "paged_lanes.h"

#include <algorithm>

#include "cpdrift/cpu/input_store.h"

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

}  // namespace

Range kv_heads_of(const Problem& p, int world, int rank) {
  const int n = std::min(world, p.dims.num_kv_heads);
  if (rank >= n) return Range{0, 0};
  return Range{std::int64_t{p.dims.num_kv_heads} * rank / n,
               std::int64_t{p.dims.num_kv_heads} * (rank + 1) / n};
}

PlanLanes compute_plan_lanes(const RunContext& ctx, const PagedWorkload& w, const SplitKv& split) {
  const Problem& p = ctx.problem;
  const int group = p.dims.group_size(), dim = p.dims.head_dim;
  const float scale = p.dims.softmax_scale();
  const bool bf16 = p.dtype == DType::bf16;
  const InputPrecision precision = bf16 ? InputPrecision::bf16 : InputPrecision::fp32;
  const ProbRounding rounding = bf16 ? ProbRounding::bf16 : ProbRounding::none;
  AttentionBackend& backend = ctx.inputs.backend();

  PlanLanes l;
  l.heads = kv_heads_of(p, ctx.collectives.size(), ctx.collectives.rank());
  const std::uint64_t layout_seed = p.seed ^ 0x5EEDBA5Eu;
  l.main_table = make_page_table(w.kv_lens, w.page_size, w.prefix_pages(), PageLayout::interleaved,
                                 layout_seed);
  for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode}) {  // present, if empty
    l.permuted[m];
    l.private_prefix[m];
    l.fp32[m];
    l.alone[m];
  }
  if (l.heads.empty()) return l;

  const Range q_heads{l.heads.begin * group, l.heads.end * group};
  const ShardShape q_shape{p.batch, q_heads, {Range{0, p.seq_len}}, dim};
  const Shard q = ctx.inputs.shard(TensorId::q, q_shape, precision);
  const Shard q32 = ctx.inputs.shard(TensorId::q, q_shape, InputPrecision::fp32);
  const LogicalKv kv = logical_kv(w, ctx.inputs, l.heads, precision);
  const LogicalKv kv32 = logical_kv(w, ctx.inputs, l.heads, InputPrecision::fp32);
  std::vector<int> rows(static_cast<std::size_t>(w.sequences()));
  for (int b = 0; b < w.sequences(); ++b) rows[static_cast<std::size_t>(b)] = b;

  const auto lane = [&](PagedCall call, ProbRounding r = ProbRounding::none) {
    return Lane{call, split, r};
  };
  const auto call_of = [](PagedMode m) {
    return m == PagedMode::decode ? PagedCall::decode : PagedCall::paged_prefill;
  };
  {
    const PagedKvCache main = filled_cache(l.main_table, kv, l.heads, rows);
    l.decode = run_paged_lane(lane(PagedCall::decode, rounding), main, w.q_len, q, rows, l.heads,
                              group, scale, backend);
    l.paged_prefill = run_paged_lane(lane(PagedCall::paged_prefill, rounding), main, w.q_len, q,
                                     rows, l.heads, group, scale, backend);
    l.full_prefill = run_paged_lane(lane(PagedCall::full_prefill, rounding), main, w.q_len, q, rows,
                                    l.heads, group, scale, backend);
  }
  l.chunked = run_contiguous_lane(lane(PagedCall::chunked_prefill, rounding), w, kv.k, kv.v, q,
                                  l.heads, group, scale, backend);
  const Lane reference{PagedCall::paged_prefill, SplitKv{SplitPolicy::disabled, 0},
                       ProbRounding::none};
  l.reference = run_contiguous_lane(reference, w, kv.k, kv.v, q, l.heads, group, scale, backend);
  l.reference_fp32 =
      run_contiguous_lane(reference, w, kv32.k, kv32.v, q32, l.heads, group, scale, backend);

  for (const PageLayout layout : {PageLayout::permuted, PageLayout::private_prefix}) {
    const PagedKvCache cache =
        filled_cache(make_page_table(w.kv_lens, w.page_size, w.prefix_pages(), layout, layout_seed),
                     kv, l.heads, rows);
    for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode}) {
      AttnShard a = run_paged_lane(lane(call_of(m), rounding), cache, w.q_len, q, rows, l.heads,
                                   group, scale, backend);
      (layout == PageLayout::permuted ? l.permuted : l.private_prefix)[m] = std::move(a);
    }
  }
  {
    const PagedKvCache main32 = filled_cache(l.main_table, kv32, l.heads, rows);
    for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode}) {
      l.fp32[m] = run_paged_lane(lane(call_of(m)), main32, w.q_len, q32, rows, l.heads, group,
                                 scale, backend);
    }
  }
  for (int b = 0; b < w.sequences(); ++b) {
    // Sequence b alone: a one-sequence cache of its own (its prompt pages private), batch 1.
    const std::vector<int> only{b};
    const PagedKvCache cache =
        filled_cache(make_page_table({w.kv_lens[static_cast<std::size_t>(b)]}, w.page_size, 0,
                                     PageLayout::interleaved, layout_seed),
                     kv, l.heads, only);
    for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode}) {
      l.alone[m].push_back(run_paged_lane(lane(call_of(m), rounding), cache, w.q_len, q, only,
                                          l.heads, group, scale, backend));
    }
  }
  return l;
}

}  // namespace cpd::paged
