// The report's training and logprob legs: the `backward` and `dlogp` sections of the report
// contract.
#include "kernels/layer_weights.h"
#include "report/plan_json.h"

namespace cpd {

using json::array_of;
using json::Object;
using json::Value;

namespace {

Value backward_provenance(const RunReport& r, const CaseResult& c) {
  const CaseSpec& spec = c.spec;
  Value dtypes = Value::object();
  for (const char* k : {"q", "k", "v", "d_out", "out", "lse", "dq", "dk", "dv"}) dtypes[k] = "fp32";
  Value v = Object{
      {"attention_mode", spec.split ? "chunked_prefill" : "prefill"},
      {"gradient_mode", "training_backward"},
      {"cp_world_size", spec.cp},
      {"requested_split_kv_policy", spec.split ? "fixed" : "disabled"},
      {"requested_split_kv_size", json::nullable(spec.split)},
      {"kv_chunk_size", json::nullable(spec.split)},
      // What the backward reads from the forward: its FP32 output (for delta = rowsum(dO * out))
      // and the merged LSE (P = exp(S - lse)); masks and positions are recomputed, not saved.
      {"saved_forward_state", json::Array{"out", "attention_lse"}},
      {"saved_forward_state_detail", "fp32_out_and_merged_lse"},
      {"gradient_inputs", json::Array{"q", "k", "v"}},
      {"gradient_outputs", json::Array{"out"}},
      {"te_backward_oracle", "not_used"},
      {"d_out", "synthetic_normal_by_global_coordinates"},
      // The KV blocks whose partial dq the query owners folded, as the messages said.
      {"actual_split_kv_plans",
       owner_plans_json(r.problem, spec, backward_split_backend(c.executed),
                        c.executed.backward_blocks.front())},
      {"query_block_grid", ranges_json(c.executed.block_bounds)},
      {"merge_order", "global_block_index"},
      {"dq_sum_order", "kv_blocks_ascending_at_query_owner"},
      {"dk_dv_sum_order", "query_blocks_ascending_at_kv_owner_then_gqa_heads_ascending"},
      {"data_movement", "ag_rs: (q, dO, lse, delta) to the KV owners, partial dq back"},
      {"accum_dtype", "fp32"},
      {"downcast_at", "final_write"},
      {"dtypes", std::move(dtypes)},
      {"decode_backward", "not_supported"}};
  // The backward runs in FP32 on every path: q, k, v and dO are the FP32 input rows (the BF16
  // rounding is the forward candidates'), out is the FP32 path's merged output.
  for (const char* k : {"q_dtype", "k_dtype", "v_dtype", "dout_dtype", "output_dtype"})
    v[k] = torch_dtype_name(DType::fp32);
  return v;
}

Value grads_json(const DiffStats& dq, const DiffStats& dk, const DiffStats& dv) {
  return Object{{"dq", stats_json(dq)}, {"dk", stats_json(dk)}, {"dv", stats_json(dv)}};
}

Value te_backward_json(const BackwardDrift& b) {
  if (!b.te_p2p) return status_json("not_requested", "run with --include-lane-backward");
  const auto& te = *b.te_p2p;
  return Object{
      {"status", "available"},
      {"emulates", "Transformer Engine AttnFuncWithCPAndKVP2P.backward"},
      {"accumulation",
       "each ring step's (query CP rank, KV CP rank) gradients written in BF16; dq summed in "
       "BF16 on the query rank over KV ranks r+1, r+2, ..., r; dK/dV summed in BF16 with their "
       "K/V over query ranks s-1, s-2, ..., s (the backward ring, the diagonal last)"},
      {"vs_fp32_reference", grads_json(te.dq, te.dk, te.dv)},
      {"vs_canonical_bf16", grads_json(te.canonical_dq, te.canonical_dk, te.canonical_dv)}};
}

}  // namespace

Value backward_json(const RunReport& r, const CaseResult& c) {
  if (!c.backward.available) return status_json("not_requested", "run with --include-backward");
  const BackwardDrift& b = c.backward;
  Value drift = grads_json(b.dq, b.dk, b.dv);
  drift["candidate_name"] =
      "cp" + std::to_string(c.spec.cp) + (c.spec.split ? "_chunked_backward" : "_backward");
  drift["out"] = stats_json(c.cp_merge_fp32.out);
  drift["lse"] = stats_json(c.cp_merge_fp32.lse);
  drift["per_rank"] = array_of(b.per_rank, [](const BackwardDrift::PerRank& p) {
    Value row = grads_json(p.dq, p.dk, p.dv);
    row["rank"] = p.cp_rank;
    return row;
  });
  drift["bf16_final_write"] = grads_json(b.bf16_dq, b.bf16_dk, b.bf16_dv);
  drift["production_lanes"] = Object{{"te_p2p", te_backward_json(b)}};
  drift["provenance"] = backward_provenance(r, c);
  return Object{{"status", "available"},
                {"report", Object{{"reference_name", "cp1_backward_reference"},
                                  {"drifts", json::Array{std::move(drift)}}}}};
}

Value token_json(const TokenPair& t) {
  return Object{{"sequence", t.sequence},
                {"position", t.position},
                {"cp_rank", t.cp_rank},
                {"logp_train", static_cast<double>(t.train)},
                {"logp_rollout", static_cast<double>(t.rollout)},
                {"delta", static_cast<double>(t.train) - static_cast<double>(t.rollout)},
                {"shard_boundary_distance", t.shard_distance},
                {"split_boundary_distance", t.split_distance}};
}

Value abs_delta_bins_json(const std::vector<DistanceBin>& bins, const std::string& unit) {
  return array_of(bins, [&unit](const DistanceBin& b) {
    return Object{{"min_" + unit, b.min},
                  {"max_" + unit, b.max < 0 ? Value() : Value(b.max)},
                  {"tokens", b.tokens},
                  {"abs_delta_mean", b.abs_mean},
                  {"abs_delta_max", b.abs_max}};
  });
}

// The RL frameworks' train/rollout figures over the active tokens (metrics/rl_metrics.h).
Value rl_metrics_json(const RlMetrics& m) {
  return Object{
      {"sign_convention", "delta = logp_train - logp_rollout (candidate - reference)"},
      {"tokens", m.tokens},
      {"abs_delta", Object{{"mean", m.abs_mean},
                           {"std", m.abs_std},
                           {"max", m.abs_max},
                           {"p50", m.abs_p50},
                           {"p99", m.abs_p99}}},
      {"importance_ratio", Object{{"mean", m.ratio_mean},
                                  {"std", m.ratio_std},
                                  {"min", m.ratio_min},
                                  {"max", m.ratio_max},
                                  {"effective_sample_size", m.effective_sample_size},
                                  {"band", m.options.ratio_band},
                                  {"outside_band_fraction", m.outside_band_fraction},
                                  {"tis_clip", m.options.tis_clip},
                                  {"tis_clip_fraction", m.tis_clip_fraction},
                                  {"chi_squared", m.chi_squared}}},
      {"kl_rollout_train",
       Object{{"k1_mean", m.k1_mean}, {"k3_mean", m.k3_mean}, {"exact_mean", m.kl_exact_mean}}},
      {"perplexity",
       Object{
           {"train", m.perplexity_train},
           {"rollout", m.perplexity_rollout},
           {"ratio", m.perplexity_rollout > 0 ? m.perplexity_train / m.perplexity_rollout : 0.0}}},
      {"first_divergent_token", m.diverged ? token_json(m.first_divergent) : Value()},
      {"worst_tokens", array_of(m.worst, token_json)},
      {"abs_delta_by_boundary_distance",
       Object{{"cp_shard", abs_delta_bins_json(m.by_shard_distance, "distance")},
              {"split", abs_delta_bins_json(m.by_split_distance, "distance")}}}};
}

namespace {

// A pair's verdict: what it had to show and whether it did.
const char* pair_status(const RolloutPair& p) {
  if (p.diagnostic) return "diagnostic";
  if (p.aligned) return p.bitwise_equal() ? "bitwise_equal" : "failed";
  return p.bitwise_equal() ? "equal_not_required" : "drift";
}

Value rollout_pair_json(const RolloutPair& p) {
  return Object{{"trainer", p.trainer},
                {"trainer_merge", p.trainer_merge},
                {"trainer_tp_reduction", p.trainer_tp_reduction},
                {"rollout", p.rollout},
                {"rollout_tp_reduction", p.rollout_tp_reduction},
                {"aligned", p.aligned},
                {"bitwise_equal", p.bitwise_equal()},
                {"status", pair_status(p)},
                {"passed", p.passed()},
                {"tokens", p.tokens},
                {"out", stats_json(p.out)},
                {"lse", stats_json(p.lse)},
                {"logprob", stats_json(p.logprob)},
                // --scope layer: the layer's output at the decoded tokens (null: the core).
                {"layer_out", p.layer ? stats_json(*p.layer) : Value()},
                {"rl_metrics", rl_metrics_json(p.rl)}};
}

}  // namespace

Value rollout_pairs_json(const RunReport& r) {
  if (r.rollout_pairs.empty()) {
    return status_json(
        "not_applicable",
        "needs prefill cases (the trainer) and paged cases (--modes paged_prefill,decode)");
  }
  const bool bf16 = r.problem.dtype == DType::bf16;
  return Object{
      {"status", "available"},
      {"positions", "every position the rollout decoded: the last q_len of each paged sequence"},
      {"trainer_output", bf16 ? "bf16_kernel" : "fp32"},
      {"trainer_merges",
       bf16 ? "canonical (the global block order), and each production lane (production_lanes)"
            : "canonical (the global block order)"},
      {"rollout_output", "paged candidate lane"},
      {"logprob", "synthetic_fp32_lm_head_projection"},
      {"aligned_means",
       "the row of every decoded position merges the same KV blocks on both sides: bits must be "
       "equal"},
      {"vocab_size", r.paged_cases.empty() ? 0 : r.paged_cases.front().vocab_size},
      {"pairs", array_of(r.rollout_pairs, rollout_pair_json)}};
}

// The layer's gradients (--include-backward): each from the case's core gradients vs from the
// CP=1 reference backward's, through the same canonical arithmetic (numerics.md §11).
Value layer_backward_json(const CaseResult& c) {
  if (c.layer.backward.empty())
    return status_json("not_requested", "run with --scope layer --include-backward");
  Object o{{"status", "available"},
           {"candidate", "fp32_cp_backward"},
           {"reference", "fp32_cp1_backward"}};
  Object grads;
  for (const auto& [name, s] : c.layer.backward) grads.emplace(name, stats_json(s));
  o.emplace("gradients", std::move(grads));
  return o;
}

Value tp_lanes_json(const std::vector<TpLaneDrift>& lanes) {
  json::Array a;
  for (const TpLaneDrift& l : lanes) {
    const TpLaneInfo& info = info_of(l.lane);
    const double share = l.vs_canonical.active_count == 0
                             ? 0.0
                             : static_cast<double>(l.vs_canonical.mismatch_count) /
                                   static_cast<double>(l.vs_canonical.active_count);
    a.push_back(Object{{"lane", to_string(l.lane)},
                       {"tensor", l.tensor},
                       {"upstream", info.upstream},
                       {"collective", info.collective},
                       {"vs_reference", stats_json(l.vs_reference)},
                       {"vs_canonical", stats_json(l.vs_canonical)},
                       {"bits_differing_from_canonical", share}});
  }
  return a;
}

Value layer_case_json(const RunReport& r, const CaseResult& c) {
  if (!c.layer.available) return status_json("not_requested", "run with --scope layer");
  const Problem& p = r.problem;
  return Object{{"status", "available"},
                {"weights", p.weights ? p.weights->source() : std::string("synthetic")},
                {"o_proj_order", to_string(p.o_proj_order)},
                {"reference_cast_dtype", torch_dtype_name(p.dtype)},
                {"candidate", p.dtype == DType::bf16 ? "bf16_cp_output" : "fp32_cp_output"},
                {"hidden_size", p.dims.hidden_size},
                {"out", stats_json(c.layer.out)},
                {"reduction_lanes", p.reduction_lanes},
                {"tp_lanes", tp_lanes_json(c.layer.tp_lanes)},
                {"backward", layer_backward_json(c)}};
}

Value dlogp_case_json(const CaseResult& c, const Problem& p) {
  if (!c.dlogp.available) return status_json("not_requested", "run with --include-dlogp");
  const bool bf16 = p.dtype == DType::bf16;
  return Object{{"status", "available"},
                {"projection", "synthetic_fp32_lm_head_projection"},
                // The layer's lm_head reads its output, sharded by vocabulary over the TP ranks;
                // the core's reads the attention output, by query head.
                {"lm_head_input", p.layer ? "layer_output" : "attention_output"},
                {"lm_head_sharding", p.layer ? "vocabulary" : "query_heads"},
                {"reference_cast_dtype", torch_dtype_name(p.dtype)},
                {"candidate", p.layer ? (bf16 ? "bf16_layer_output" : "fp32_layer_output")
                                      : (bf16 ? "bf16_cp_output" : "fp32_cp_output")},
                {"vocab_size", c.dlogp.vocab_size},
                {"active_token_count", c.dlogp.drift.active_count},
                {"drift", stats_json(c.dlogp.drift)},
                {"rl_metrics", rl_metrics_json(c.dlogp.rl)}};
}

Value dlogp_root_json(const RunReport& r) {
  const char* const source = "synthetic_fp32_lm_head_projection";
  if (r.vocab_size <= 0) {
    return Object{{"source", source},
                  {"status", "not_requested"},
                  {"reason", "selected-token logprob drift is not requested (--include-dlogp)"}};
  }
  return Object{
      {"source", source},
      {"status", "requested"},
      {"reason", "requested with --include-dlogp"},
      {"vocab_size", r.vocab_size},
      {"lm_head", "W[v, c] = normal(seed, lm_head, v*Hq*D + c) * fp32(1/sqrt(Hq*D)), FP32"},
      {"hidden_layout", "[B, S, Hq*D] from out[B, Hq, S, D]"},
      {"logit_sum_order", "per-head partials folded in ascending head order (TP ranks ascending)"},
      {"target", "(b*S + s) mod V"},
      {"active_tokens", "all but each sequence's first"}};
}

}  // namespace cpd
