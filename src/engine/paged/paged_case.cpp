#include "engine/paged/paged_case.h"

#include <cstdio>
#include <optional>

#include "engine/case_runner.h"
#include "engine/paged/paged_lanes.h"
#include "engine/rollout_pairs.h"
#include "engine/run_context.h"

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
  const AttnShard& candidate = o.held.keep(final_write(l.mode_rows(spec.mode), bf16, ctx.pool));
  o.candidate = paged::same_rows(candidate, in.reference, w.q_len);
  if (ctx.decoded != nullptr) {  // the rollout's side of the trainer-vs-rollout pairs
    ctx.decoded->rollout.push_back(
        gather_rollout_rows(ctx, w, o.name, spec.split.policy == SplitPolicy::auto_select, o.plans,
                            paged::head_owners(ctx.problem, spec.tp, ctx.collectives.size()),
                            local ? &candidate : nullptr));
  }
  o.fp32 = paged::same_rows(l.fp32.at(spec.mode), in.reference_fp32, w.q_len);

  const std::string base = paged_case_group(o.name) + "/";
  const int dim = ctx.problem.dims.head_dim;
  // Publishes one lane tensor; returns its index (the candidate's digest is its tensor's).
  const auto publish = [&](const char* path, const Shard& rows, int width, bool bf16_values,
                           bool digest) {
    o.tensors.push_back(paged::query_rows_tensor(
        ctx, w, spec.tp, base + path, local ? &rows : nullptr, width, bf16_values, digest));
    return static_cast<int>(o.tensors.size()) - 1;
  };
  o.candidate.out.candidate_tensor = publish("candidate/out", candidate.out, dim, bf16, true);
  o.candidate.lse.candidate_tensor = publish("candidate/lse", candidate.lse, 1, false, true);
  publish("reference/out", reference_cast.out, dim, bf16, false);
  publish("reference/lse", reference_cast.lse, 1, false, false);
  // Under BF16 the candidate's figure is against the reference before its BF16 write: that too,
  // so that a dump reproduces the figure (cpdrift-inspect summary).
  if (bf16) publish("reference_fp32_arithmetic/out", in.reference.out, dim, false, false);

  o.vocab_size = options.vocab_size;
  paged::PagedLogprobs lp = paged::paged_logprobs(ctx, w, in, local ? &candidate : nullptr,
                                                  local ? &reference_cast : nullptr, o.vocab_size);
  const std::vector<float>& cand = o.held.keep(std::move(lp.candidate));
  const std::vector<float>& ref = o.held.keep(std::move(lp.reference));
  o.dlogp.add(0, cand.data(), ref.data(), cand.size());
  for (std::size_t k = 0; k < cand.size(); ++k) {  // rank 0: [B][q_len]
    const int b = static_cast<int>(k / static_cast<std::size_t>(w.q_len));
    const std::int64_t pos = w.queries(b).begin + static_cast<std::int64_t>(k) % w.q_len;
    // The split's interior boundaries of the sequence, as the candidate lane ran it.
    std::vector<std::int64_t> edges;
    for (const Range& blk : o.plans.at(static_cast<std::size_t>(b))) {
      if (blk.begin > 0) edges.push_back(blk.begin);
    }
    o.dlogp_tokens.push_back(
        TokenPair{b, pos, 0, cand[k], ref[k], lp.kl[k], -1, boundary_distance(edges, pos)});
  }
  paged::add_invariances(w, l, o);
  o.processes_used = 0;
  for (int r = 0; r < ctx.collectives.size(); ++r) {
    if (!paged::kv_heads_of(ctx.problem, spec.tp, ctx.collectives.size(), r).empty())
      ++o.processes_used;
  }
  sink.paged_case(o);
}

}  // namespace

const char* to_string(PagedMode m) { return m == PagedMode::decode ? "decode" : "paged_prefill"; }

std::string paged_case_name(const PagedCaseSpec& spec, DType dtype) {
  std::string split = to_string(spec.split.policy);
  if (spec.split.policy == SplitPolicy::fixed) split = "fixed" + std::to_string(spec.split.size);
  return "qwen3_8b_tp" + std::to_string(spec.tp) + "_" + to_string(spec.mode) + "_split_kv_" +
         split + "_" + to_string(dtype);
}

void run_paged_cases(const RunContext& ctx, const PagedOptions& o,
                     const std::vector<PagedCaseSpec>& specs, CaseSink& sink) {
  const PagedWorkload w = make_paged_workload(ctx.problem, o.page_size, o.q_len);
  // The specs come TP-major, then plan-major: the inputs follow each rollout TP's placement,
  // and each plan's lanes run once for its modes.
  std::optional<paged::PagedInputs> in;
  std::optional<AttnShard> reference_cast;
  std::optional<paged::PlanLanes> lanes;
  std::optional<SplitKv> lanes_split;
  const bool say = o.progress && ctx.collectives.root();
  for (const PagedCaseSpec& spec : specs) {
    const auto started = std::chrono::steady_clock::now();
    if (!in || in->tp != spec.tp) {
      lanes.reset();
      lanes_split.reset();
      reference_cast.reset();
      in.reset();
      in = paged::prepare_paged_inputs(ctx, w, spec.tp);
      reference_cast = final_write(in->reference, ctx.problem.dtype == DType::bf16, ctx.pool);
    }
    if (!lanes_split || !(*lanes_split == spec.split)) {
      lanes.reset();
      std::vector<PagedMode> modes;  // the modes this plan's cases ask for
      for (const PagedCaseSpec& other : specs) {
        if (other.tp == spec.tp && other.split == spec.split) modes.push_back(other.mode);
      }
      const char* policy = to_string(spec.split.policy);
      if (say) {
        std::fprintf(stderr, "cpdrift: paged lanes, rollout TP=%d, split-KV %s ...\n", spec.tp,
                     policy);
      }
      lanes = paged::compute_plan_lanes(ctx, w, *in, spec.split, modes);
      lanes_split = spec.split;
      if (say) {
        std::fprintf(
            stderr, "cpdrift: paged lanes, rollout TP=%d, split-KV %s: %.1f s\n", spec.tp, policy,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      }
    }
    run_paged_case(ctx, o, w, *in, *reference_cast, *lanes, spec, started, sink);
  }
}

}  // namespace cpd
