#include "engine/paged/paged_case.h"

#include <cstdio>
#include <optional>

#include "cpdrift/logprob_math.h"
#include "engine/case_runner.h"
#include "engine/paged/paged_lanes.h"
#include "engine/rollout_pairs.h"
#include "engine/run_context.h"

namespace cpd {
namespace {

// The [B, Hq, q_len, width] tensor `path` of one lane's rows (`local`: this process's, null
// where it computes no KV head): pieces in global order, each held by the process computing
// its KV head.
CaseTensor query_rows_tensor(const RunContext& ctx, const PagedWorkload& w, int tp,
                             std::string path, const Shard* local, int width, bool bf16,
                             bool digest) {
  const Problem& p = ctx.problem;
  const int world = ctx.collectives.size(), me = ctx.collectives.rank();
  const std::vector<int> owner = paged::head_owners(p, tp, world);
  CaseTensor t;
  t.path = std::move(path);
  t.digest = digest;
  t.bf16 = bf16;
  t.layout = GlobalTensor{p.batch, p.dims.num_q_heads, w.q_len, width, {}, {}};
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.dims.num_q_heads; ++h) {
      const int proc = owner[static_cast<std::size_t>(h)];
      t.layout.add(GlobalPiece{b, h, Range{0, w.q_len}, proc},
                   proc == me ? local->at(b, h, 0) : nullptr);
    }
  }
  t.attributes = {{"shape", width > 1 ? "[B, H, Q, D]" : "[B, H, Q]"},
                  {"rows", "row i of sequence b is position kv_len(b) - q_len + i"}};
  return t;
}

// What one case of the plan whose lanes are `l` computed, handed to `sink`.
void run_paged_case(const RunContext& ctx, const PagedOptions& options, const PagedWorkload& w,
                    const paged::PagedInputs& in, const paged::PlanLanes& l,
                    const PagedCaseSpec& spec, std::chrono::steady_clock::time_point started,
                    CaseSink& sink) {
  const bool bf16 = ctx.problem.dtype == DType::bf16;
  const bool local = !in.heads.empty();
  PagedCaseOutputs o;
  o.started = started;
  o.spec = spec;
  o.name = paged_case_name(spec, ctx.problem);
  o.workload = w;
  o.physical_pages = in.main_table.num_pages;
  o.block_tables_digest = page_table_digest(in.main_table);
  // The plans the candidate lane ran with (rank 0 always computes KV heads, and its report is
  // the job's).
  o.plans = l.mode_plans(spec.mode);
  const AttnShard& candidate = o.held.keep(final_write(l.mode_rows(spec.mode), bf16, ctx.pool));
  o.candidate = paged::same_rows(candidate, in.reference, w.q_len);
  o.fp32 = paged::same_rows(l.fp32.at(spec.mode), in.reference_fp32, w.q_len);

  const std::string base = paged_case_group(o.name) + "/";
  const int dim = ctx.problem.dims.head_dim;
  // Publishes one lane tensor; returns its index (the candidate's digest is its tensor's).
  const auto publish = [&](const char* path, const Shard& rows, int width, bool bf16_values,
                           bool digest) {
    o.tensors.push_back(query_rows_tensor(ctx, w, spec.tp, base + path, local ? &rows : nullptr,
                                          width, bf16_values, digest));
    return static_cast<int>(o.tensors.size()) - 1;
  };
  o.candidate.out.candidate_tensor = publish("candidate/out", candidate.out, dim, bf16, true);
  o.candidate.lse.candidate_tensor = publish("candidate/lse", candidate.lse, 1, false, true);
  publish("reference/out", in.reference_cast.out, dim, bf16, false);
  publish("reference/lse", in.reference_cast.lse, 1, false, false);
  // Under BF16 the candidate's figure is against the reference before its BF16 write: that too,
  // so that a dump reproduces the figure (cpdrift-inspect summary).
  if (bf16) publish("reference_fp32_arithmetic/out", in.reference.out, dim, false, false);

  o.vocab_size = options.vocab_size;
  // Both sides' rows on rank 0 through the synthetic lm_head: their target-token logprobs and
  // each token's KL(reference ‖ candidate).
  const bool auto_split = spec.split.policy == SplitPolicy::auto_select;
  const std::vector<int> owners = paged::head_owners(ctx.problem, spec.tp, ctx.collectives.size());
  // The rollout's TP collective (vLLM's flattened tokens, sequence-major): a decode step's
  // buffer holds one token of each sequence, a prefill call all of the call's tokens.
  const bool decode = spec.mode == PagedMode::decode;
  const TpCollective tp{
      spec.tp, {kRolloutTpLanes.begin(), kRolloutTpLanes.end()}, [&](int b, std::int64_t i) {
        return decode ? CollectiveRow{b, w.sequences()}
                      : CollectiveRow{b * w.q_len + i, w.sequences() * w.q_len};
      }};
  DecodedRows cand = gather_rollout_rows(ctx, w, o.name, auto_split, o.plans, owners,
                                         local ? &candidate : nullptr, o.vocab_size, &tp);
  const DecodedRows ref =
      gather_rollout_rows(ctx, w, o.name, auto_split, o.plans, owners,
                          local ? &in.reference_cast : nullptr, o.vocab_size, nullptr);
  const std::vector<float>& c = o.held.keep(cand.logprob);
  const std::vector<float>& r = o.held.keep(ref.logprob);
  o.dlogp.add(0, c.data(), r.data(), c.size());
  if (ctx.problem.layer) {  // the layer's output of both, [B][q_len][hidden] on rank 0
    const std::vector<float>& cl = o.held.keep(cand.layer);
    const std::vector<float>& rl = o.held.keep(ref.layer);
    o.layer.emplace().add(0, cl.data(), rl.data(), cl.size());
    // The candidate's layer output through the rollout's TP lanes, on rank 0 (every process
    // makes the same comparisons; the rows are kept here: `cand` moves on).
    for (std::size_t k = 0; k < (ctx.problem.reduction_lanes ? kRolloutTpLanes.size() : 0); ++k) {
      TpLaneComparisons& lane =
          o.layer_tp_lanes.emplace_back(TpLaneComparisons{kRolloutTpLanes[k], "out", {}, {}});
      const std::vector<float>& rows =
          o.held.keep(k < cand.tp_lanes.size() ? cand.tp_lanes[k].layer : std::vector<float>{});
      lane.vs_reference.add(0, rows.data(), rl.data(), rows.size());
      lane.vs_canonical.add(0, rows.data(), cl.data(), rows.size());
    }
  }
  for (std::size_t k = 0; k < c.size(); ++k) {  // rank 0: [B][q_len]
    const int b = static_cast<int>(k / static_cast<std::size_t>(w.q_len));
    const std::int64_t pos = w.queries(b).begin + static_cast<std::int64_t>(k) % w.q_len;
    // The split's interior boundaries of the sequence, as the candidate lane ran it.
    std::vector<std::int64_t> edges;
    for (const Range& blk : o.plans.at(static_cast<std::size_t>(b))) {
      if (blk.begin > 0) edges.push_back(blk.begin);
    }
    const std::size_t z = k * static_cast<std::size_t>(o.vocab_size);
    const float kl = static_cast<float>(
        kl_divergence(ref.logits.data() + z, cand.logits.data() + z, o.vocab_size));
    o.dlogp_tokens.push_back(
        TokenPair{b, pos, 0, c[k], r[k], kl, -1, boundary_distance(edges, pos)});
  }
  // The rollout's side of the trainer-vs-rollout pairs.
  if (ctx.decoded != nullptr) ctx.decoded->rollout.push_back(std::move(cand));
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

std::string paged_case_name(const PagedCaseSpec& spec, const Problem& problem) {
  std::string split = to_string(spec.split.policy);
  if (spec.split.policy == SplitPolicy::fixed) split = "fixed" + std::to_string(spec.split.size);
  return model_slug(problem.dims) + "_tp" + std::to_string(spec.tp) + "_" + to_string(spec.mode) +
         "_split_kv_" + split + "_" + to_string(problem.dtype);
}

void run_paged_cases(const RunContext& ctx, const PagedOptions& o,
                     const std::vector<PagedCaseSpec>& specs, CaseSink& sink) {
  const PagedWorkload w = make_paged_workload(ctx.problem, o.page_size, o.q_len);
  // The specs come TP-major, then plan-major: the inputs follow each rollout TP's placement,
  // and each plan's lanes run once for its modes.
  std::optional<paged::PagedInputs> in;
  std::optional<paged::PlanLanes> lanes;
  const bool say = o.progress && ctx.collectives.root();
  for (const PagedCaseSpec& spec : specs) {
    const auto started = std::chrono::steady_clock::now();
    if (!in || in->tp != spec.tp) {
      lanes.reset();
      in.reset();
      in = paged::prepare_paged_inputs(ctx, w, spec.tp);
    }
    if (!lanes || !(lanes->split == spec.split)) {
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
      if (say) {
        std::fprintf(
            stderr, "cpdrift: paged lanes, rollout TP=%d, split-KV %s: %.1f s\n", spec.tp, policy,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      }
    }
    run_paged_case(ctx, o, w, *in, *lanes, spec, started, sink);
  }
}

}  // namespace cpd
