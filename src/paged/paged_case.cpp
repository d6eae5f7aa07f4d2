#include "cpdrift/paged/paged_case.h"

#include <cstdio>

#include "cpdrift/engine/case_runner.h"
#include "paged_lanes.h"

namespace cpd {
namespace {

// What one case of the plan whose lanes are `l` computed, handed to `sink`.
void run_paged_case(const RunContext& ctx, const PagedOptions& options, const PagedWorkload& w,
                    const paged::PagedInputs& in, const AttnShard& reference_cast,
                    const paged::PlanLanes& l, const PagedCaseSpec& spec,
                    std::chrono::steady_clock::time_point started, CaseSink& sink) {
  const bool bf16 = ctx.problem.dtype == DType::bf16;
  const bool local = !in.heads.empty();
  PagedCaseOutputs o;
  o.started = started;
  o.spec = spec;
  o.name = paged_case_name(spec, ctx.problem.dtype);
  o.workload = w;
  o.physical_pages = in.main_table.num_pages;
  o.block_tables_digest = page_table_digest(in.main_table);
  // The plans the candidate lane ran with (rank 0 always computes KV heads, and its report is
  // the job's).
  o.plans = l.mode_plans(spec.mode);
  const AttnShard& candidate = o.held.keep(final_write(l.mode_rows(spec.mode), bf16));
  o.candidate = paged::same_rows(candidate, in.reference, w.q_len);
  o.fp32 = paged::same_rows(l.fp32.at(spec.mode), in.reference_fp32, w.q_len);

  const std::string base = paged_case_group(o.name) + "/";
  const int dim = ctx.problem.dims.head_dim;
  // Publishes one lane tensor; returns its index (the candidate's digest is its tensor's).
  const auto publish = [&](const char* path, const Shard& rows, int width, bool bf16_values,
                           bool digest) {
    o.tensors.push_back(paged::query_rows_tensor(ctx, w, base + path, local ? &rows : nullptr,
                                                 width, bf16_values, digest));
    return static_cast<int>(o.tensors.size()) - 1;
  };
  o.candidate.out.candidate_tensor = publish("candidate/out", candidate.out, dim, bf16, true);
  o.candidate.lse.candidate_tensor = publish("candidate/lse", candidate.lse, 1, false, true);
  publish("reference/out", reference_cast.out, dim, bf16, false);
  publish("reference/lse", reference_cast.lse, 1, false, false);

  o.vocab_size = options.vocab_size;
  paged::PagedLogprobs lp = paged::paged_logprobs(ctx, w, in.heads, local ? &candidate : nullptr,
                                                  local ? &reference_cast : nullptr, o.vocab_size);
  const std::vector<float>& cand = o.held.keep(std::move(lp.candidate));
  o.dlogp.add(0, cand.data(), o.held.keep(std::move(lp.reference)).data(), cand.size());
  paged::add_invariances(w, l, o);
  o.processes_used = std::min(ctx.collectives.size(), ctx.problem.dims.num_kv_heads);
  sink.paged_case(o);
}

}  // namespace

const char* to_string(PagedMode m) { return m == PagedMode::decode ? "decode" : "paged_prefill"; }

std::string paged_case_name(const PagedCaseSpec& spec, DType dtype) {
  std::string split = to_string(spec.split.policy);
  if (spec.split.policy == SplitPolicy::fixed) split = "fixed" + std::to_string(spec.split.size);
  return std::string("qwen3_8b_tp1_") + to_string(spec.mode) + "_split_kv_" + split + "_" +
         to_string(dtype);
}

void run_paged_cases(const RunContext& ctx, const PagedOptions& o,
                     const std::vector<PagedCaseSpec>& specs, CaseSink& sink) {
  const PagedWorkload w = make_paged_workload(ctx.problem, o.page_size, o.q_len);
  const paged::PagedInputs in = paged::prepare_paged_inputs(ctx, w);
  const AttnShard reference_cast = final_write(in.reference, ctx.problem.dtype == DType::bf16);
  std::optional<paged::PlanLanes> lanes;
  std::optional<SplitKv> lanes_split;
  const bool say = o.progress && ctx.collectives.root();
  for (const PagedCaseSpec& spec : specs) {
    const auto started = std::chrono::steady_clock::now();
    if (!lanes_split || !(*lanes_split == spec.split)) {
      lanes.reset();
      std::vector<PagedMode> modes;  // the modes this plan's cases ask for
      for (const PagedCaseSpec& other : specs) {
        if (other.split == spec.split) modes.push_back(other.mode);
      }
      const char* policy = to_string(spec.split.policy);
      if (say) std::fprintf(stderr, "cpdrift: paged lanes, split-KV %s ...\n", policy);
      lanes = paged::compute_plan_lanes(ctx, w, in, spec.split, modes);
      lanes_split = spec.split;
      if (say) {
        std::fprintf(
            stderr, "cpdrift: paged lanes, split-KV %s: %.1f s\n", policy,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      }
    }
    run_paged_case(ctx, o, w, in, reference_cast, *lanes, spec, started, sink);
  }
}

}  // namespace cpd
