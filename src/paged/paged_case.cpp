#include "cpdrift/paged/paged_case.h"

#include <chrono>
#include <cstdio>

#include "cpdrift/cpu/input_store.h"
#include "paged_lanes.h"
#include "paged_publish.h"

namespace cpd {
namespace {

using paged::Pairs;
using paged::PlanLanes;

OutLseStats stats_of(const RunContext& ctx, const Pairs& p) {
  return OutLseStats{compute_diff_stats(p.out, ctx.collectives, &ctx.pool),
                     compute_diff_stats(p.lse, ctx.collectives, &ctx.pool)};
}

// Rows of two query-row lanes (same sequences, same rows), every (sequence, local head).
Pairs same_rows(const AttnShard& c, const AttnShard& r, std::int64_t q_len) {
  Pairs p;
  for (int b = 0; b < c.out.shape.batch; ++b) {
    for (std::int64_t h = c.out.shape.heads.begin; h < c.out.shape.heads.end; ++h)
      p.add(c, b, 0, r, b, 0, h, q_len);
  }
  return p;
}

Invariance invariance(const RunContext& ctx, std::string name, std::string compares, const Pairs& p,
                      std::string not_applicable = "") {
  Invariance inv;
  inv.name = std::move(name);
  inv.compares = std::move(compares);
  inv.applicable = not_applicable.empty();
  inv.reason = std::move(not_applicable);
  inv.stats = stats_of(ctx, p);
  return inv;
}

// The case's invariances from its plan's lanes (collective: the same calls everywhere).
std::vector<Invariance> invariances_of(const RunContext& ctx, const PagedCaseSpec& spec,
                                       const PagedWorkload& w, const PlanLanes& l,
                                       int physical_pages) {
  const AttnShard& rows = l.mode_rows(spec.mode);
  const char* mode = to_string(spec.mode);
  std::vector<Invariance> out;
  Pairs alone;
  for (std::size_t b = 0; b < l.alone.at(spec.mode).size(); ++b) {
    const AttnShard& a = l.alone.at(spec.mode)[b];
    for (std::int64_t h = a.out.shape.heads.begin; h < a.out.shape.heads.end; ++h) {
      alone.add(rows, static_cast<int>(b), 0, a, 0, 0, h, w.q_len);
    }
  }
  out.push_back(
      invariance(ctx, "batch_composition",
                 std::string(mode) +
                     " rows of every sequence in one batch vs each sequence alone in its own cache",
                 alone, w.sequences() < 2 ? "one sequence: no batch to compose" : ""));
  out.push_back(invariance(
      ctx, "page_layout",
      std::string(mode) + " rows on the allocator's page layout vs the physical pages shuffled "
                          "(block tables remapped)",
      same_rows(rows, l.permuted.at(spec.mode), w.q_len),
      physical_pages < 2 ? "one physical page: nothing to shuffle" : ""));
  out.push_back(invariance(
      ctx, "prefix_cache",
      std::string(mode) +
          " rows with the prompt's pages shared by every sequence vs private copies",
      same_rows(rows, l.private_prefix.at(spec.mode), w.q_len),
      w.prefix_pages() == 0 ? "no shared prompt prefix (one sequence, or too short for a page)"
                            : ""));
  Pairs decode_full;
  for (int b = 0; b < w.sequences(); ++b) {
    for (std::int64_t h = l.decode.out.shape.heads.begin; h < l.decode.out.shape.heads.end; ++h) {
      decode_full.add(l.decode, b, 0, l.full_prefill, b, w.queries(b).begin, h, w.q_len);
    }
  }
  out.push_back(invariance(
      ctx, "decode_vs_prefill",
      "decode step t vs row t of the full paged prefill (the trainer's rows read from the cache)",
      decode_full));
  out.push_back(
      invariance(ctx, "query_position_paged_prefill",
                 "decode step t vs row t of the paged prefill of the last q_len positions",
                 same_rows(l.decode, l.paged_prefill, w.q_len)));
  out.push_back(invariance(
      ctx, "query_position_chunked_prefill",
      "decode step t vs row t of the contiguous chunked prefill (query chunks of 3 pages, each "
      "attending [0, chunk end), no cache)",
      same_rows(l.decode, l.chunked, w.q_len)));
  return out;
}

}  // namespace

const char* to_string(PagedMode m) { return m == PagedMode::decode ? "decode" : "paged_prefill"; }

std::string paged_case_name(const PagedCaseSpec& spec, DType dtype) {
  std::string split = to_string(spec.split.policy);
  if (spec.split.policy == SplitPolicy::fixed) split = "fixed" + std::to_string(spec.split.size);
  return std::string("qwen3_8b_tp1_") + to_string(spec.mode) + "_split_kv_" + split + "_" +
         to_string(dtype);
}

std::vector<PagedCaseResult> run_paged_cases(const RunContext& ctx, const PagedOptions& o,
                                             const std::vector<PagedCaseSpec>& specs) {
  const Problem& p = ctx.problem;
  const PagedWorkload w = make_paged_workload(p, o.page_size, o.q_len);
  const bool bf16 = p.dtype == DType::bf16;
  const paged::PagedInputs in = paged::prepare_paged_inputs(ctx, w);
  const AttnShard reference_cast = final_write(in.reference, bf16);
  std::vector<PagedCaseResult> results;
  std::optional<PlanLanes> lanes;
  std::optional<SplitKv> lanes_split;
  for (const PagedCaseSpec& spec : specs) {
    const auto started = std::chrono::steady_clock::now();
    if (!lanes_split || !(*lanes_split == spec.split)) {
      lanes.reset();
      std::vector<PagedMode> modes;  // the modes this plan's cases ask for
      for (const PagedCaseSpec& other : specs) {
        if (other.split == spec.split) modes.push_back(other.mode);
      }
      const bool say = o.progress && ctx.collectives.root();
      if (say)
        std::fprintf(stderr, "cpdrift: paged lanes, split-KV %s ...\n",
                     to_string(spec.split.policy));
      lanes = paged::compute_plan_lanes(ctx, w, in, spec.split, modes);
      lanes_split = spec.split;
      if (say) {
        std::fprintf(
            stderr, "cpdrift: paged lanes, split-KV %s: %.1f s\n", to_string(spec.split.policy),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      }
    }
    const PlanLanes& l = *lanes;
    PagedCaseResult r;
    r.spec = spec;
    r.name = paged_case_name(spec, p.dtype);
    r.workload = w;
    r.physical_pages = in.main_table.num_pages;
    r.block_tables_digest = page_table_digest(in.main_table);
    // The plans the candidate lane ran with (rank 0 always computes KV heads, and its report
    // is the job's).
    r.plans = l.mode_plans(spec.mode);
    for (std::size_t b = 0; b < r.plans.size(); ++b) {
      if (std::string e = coverage_error(r.plans[b], w.kv_lens[b]); !e.empty()) {
        r.coverage_errors.push_back("sequence " + std::to_string(b) + ": " + e);
      }
    }
    const AttnShard& rows = l.mode_rows(spec.mode);
    const AttnShard candidate = final_write(rows, bf16);
    r.candidate = stats_of(ctx, same_rows(candidate, in.reference, w.q_len));
    r.fp32 = stats_of(ctx, same_rows(l.fp32.at(spec.mode), in.reference_fp32, w.q_len));
    const paged::Published pub =
        paged::publish_rows(ctx, w, r.name, candidate, reference_cast, in.heads, bf16);
    if (ctx.collectives.root()) {
      r.candidate.out.digest = pub.candidate_out;
      r.candidate.lse.digest = pub.candidate_lse;
    }
    r.vocab_size = o.vocab_size;
    r.dlogp = paged::dlogp_drift(ctx, w, pub, o.vocab_size);
    r.invariances = invariances_of(ctx, spec, w, l, r.physical_pages);
    r.processes_used = std::min(ctx.collectives.size(), p.dims.num_kv_heads);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace cpd
