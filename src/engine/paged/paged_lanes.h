// The lanes one split plan computes on this process (its KV heads), shared by the plan's
// decode and paged-prefill cases.
#pragma once

#include <map>
#include <vector>

#include "engine/paged/paged_attention.h"
#include "engine/paged/paged_case.h"
#include "engine/run_context.h"

namespace cpd::paged {

/// `rows` rows of query head h: sequence cs from row crow of `c` against sequence rs from row
/// rrow of `r`, added to `into`.
inline void add_rows(OutLseComparison& into, const AttnShard& c, int cs, std::int64_t crow,
                     const AttnShard& r, int rs, std::int64_t rrow, std::int64_t h,
                     std::int64_t rows) {
  const auto dim = static_cast<std::size_t>(c.out.shape.width);
  into.out.add(0, c.out.at(cs, h, crow), r.out.at(rs, h, rrow),
               static_cast<std::size_t>(rows) * dim);
  into.lse.add(0, c.lse.at(cs, h, crow), r.lse.at(rs, h, rrow), static_cast<std::size_t>(rows));
}

/// What every split plan shares on this process: its KV heads, the inputs, the allocator's
/// page table, and the references (FP32, split disabled, contiguous), computed once per run.
struct PagedInputs {
  int tp = 1;   // the rollout TP the placement follows
  Range heads;  // this process's KV heads (empty: it computes nothing)
  PageTable main_table;
  Shard q, q32;              // the case dtype's queries, and FP32 ones
  LogicalKv kv, kv32;        // likewise K and V
  AttnShard reference;       // FP32 arithmetic on the candidate's inputs
  AttnShard reference_cast;  // `reference` as the case dtype's final write casts it
  AttnShard reference_fp32;  // FP32 arithmetic on FP32 inputs
};

/// The lanes of one split plan, shared by its decode and paged-prefill cases.
struct PlanLanes {
  SplitKv split;
  // The case dtype's arithmetic (BF16 inputs and P under --dtype bf16) on the main cache.
  AttnShard decode, paged_prefill, full_prefill;
  // Per sequence, the split plan the decode and paged-prefill lanes ran at its full context
  // (recorded by the lanes; empty on a process that computes no KV head).
  std::vector<std::vector<Range>> decode_plans, paged_prefill_plans;
  AttnShard chunked;  // the same query rows from contiguous K/V, no cache
  // Per requested mode: the rows again on other layouts, alone, and in FP32.
  std::map<PagedMode, AttnShard> permuted, private_prefix, fp32;
  std::map<PagedMode, std::vector<AttnShard>> alone;  // per sequence

  const AttnShard& mode_rows(PagedMode m) const {
    return m == PagedMode::decode ? decode : paged_prefill;
  }
  const std::vector<std::vector<Range>>& mode_plans(PagedMode m) const {
    return m == PagedMode::decode ? decode_plans : paged_prefill_plans;
  }
};

/// KV heads [begin, end) process `rank` of `world` computes under rollout TP `tp`: contiguous,
/// within the TP ranks' head boundaries. With at least as many processes as TP ranks, TP rank
/// t gets processes [t·world/tp, (t+1)·world/tp), which split its KV heads as evenly as can be
/// (some none when they outnumber its heads); with fewer, process w hosts the TP ranks t with
/// t·world/tp = w (rounded down), whose heads are consecutive.
Range kv_heads_of(const Problem& p, int tp, int world, int rank);
/// The process computing each query head (the owner of its KV head).
std::vector<int> head_owners(const Problem& p, int tp, int world);

PagedInputs prepare_paged_inputs(const RunContext& ctx, const PagedWorkload& w, int tp);

/// The lanes of `split`; the per-mode ones only for `modes`.
PlanLanes compute_plan_lanes(const RunContext& ctx, const PagedWorkload& w, const PagedInputs& in,
                             const SplitKv& split, const std::vector<PagedMode>& modes);

/// Rows of two query-row lanes (same sequences, same rows), every (sequence, local head).
OutLseComparison same_rows(const AttnShard& c, const AttnShard& r, std::int64_t q_len);

/// The case's invariances from its plan's lanes, added to `o` (the same calls everywhere).
void add_invariances(const PagedWorkload& w, const PlanLanes& l, PagedCaseOutputs& o);

}  // namespace cpd::paged
