// The report's training and logprob legs: the `backward` and `dlogp` sections of the report
// contract.
#include "report/training_legs_json.h"

#include "report/plan_json.h"

namespace cpd {

using json::Value;

namespace {

Value backward_provenance(const RunReport& r, const CaseResult& c) {
  const CaseSpec& spec = c.spec;
  Value v = Value::object();
  v["attention_mode"] = spec.split ? "chunked_prefill" : "prefill";
  v["gradient_mode"] = "training_backward";
  v["cp_world_size"] = spec.cp;
  v["requested_split_kv_policy"] = spec.split ? "fixed" : "disabled";
  v["requested_split_kv_size"] = spec.split ? Value(*spec.split) : Value(nullptr);
  v["kv_chunk_size"] = spec.split ? Value(*spec.split) : Value(nullptr);
  // What the backward reads from the forward: its FP32 output (for delta = rowsum(dO * out)) and
  // the merged LSE (P = exp(S - lse)); masks and positions are recomputed, not saved.
  Value saved = Value::array();
  for (const char* k : {"out", "attention_lse"}) saved.push_back(k);
  v["saved_forward_state"] = std::move(saved);
  v["saved_forward_state_detail"] = "fp32_out_and_merged_lse";
  v["gradient_inputs"] = Value(json::Array{"q", "k", "v"});
  v["gradient_outputs"] = Value(json::Array{"out"});
  // The backward runs in FP32 on every path: q, k, v and dO are the FP32 input rows (the BF16
  // rounding is the forward candidates'), out is the FP32 path's merged output.
  for (const char* k : {"q_dtype", "k_dtype", "v_dtype", "dout_dtype", "output_dtype"})
    v[k] = torch_dtype_name(DType::fp32);
  v["te_backward_oracle"] = "not_used";
  v["d_out"] = "synthetic_normal_by_global_coordinates";
  // The KV blocks whose partial dq the query owners folded, as the messages said.
  Value plans = Value::array();
  for (int owner = 0; owner < spec.cp; ++owner) {
    plans.push_back(split_plan_json(r.problem, spec, backward_split_backend(c.executed),
                                    c.executed.backward_blocks.front(), owner));
  }
  v["actual_split_kv_plans"] = std::move(plans);
  v["query_block_grid"] = ranges_json(c.executed.block_bounds);
  v["merge_order"] = "global_block_index";
  v["dq_sum_order"] = "kv_blocks_ascending_at_query_owner";
  v["dk_dv_sum_order"] = "query_blocks_ascending_at_kv_owner_then_gqa_heads_ascending";
  v["data_movement"] = "ag_rs: (q, dO, lse, delta) to the KV owners, partial dq back";
  v["accum_dtype"] = "fp32";
  v["downcast_at"] = "final_write";
  Value dtypes = Value::object();
  for (const char* k : {"q", "k", "v", "d_out", "out", "lse", "dq", "dk", "dv"}) dtypes[k] = "fp32";
  v["dtypes"] = std::move(dtypes);
  v["decode_backward"] = "not_supported";
  return v;
}

Value grads_json(const DiffStats& dq, const DiffStats& dk, const DiffStats& dv) {
  Value v = Value::object();
  v["dq"] = stats_json(dq);
  v["dk"] = stats_json(dk);
  v["dv"] = stats_json(dv);
  return v;
}

}  // namespace

Value backward_json(const RunReport& r, const CaseResult& c) {
  Value v = Value::object();
  if (!c.backward.available) {
    v["status"] = "not_requested";
    v["reason"] = "run with --include-backward";
    return v;
  }
  const BackwardDrift& b = c.backward;
  Value drift = grads_json(b.dq, b.dk, b.dv);
  drift["candidate_name"] =
      "cp" + std::to_string(c.spec.cp) + (c.spec.split ? "_chunked_backward" : "_backward");
  drift["out"] = stats_json(c.cp_merge_fp32.out);
  drift["lse"] = stats_json(c.cp_merge_fp32.lse);
  Value per_rank = Value::array();
  for (const BackwardDrift::PerRank& p : b.per_rank) {
    Value row = grads_json(p.dq, p.dk, p.dv);
    row["rank"] = p.cp_rank;
    per_rank.push_back(std::move(row));
  }
  drift["per_rank"] = std::move(per_rank);
  drift["bf16_final_write"] = grads_json(b.bf16_dq, b.bf16_dk, b.bf16_dv);
  Value te = Value::object();
  if (b.te_p2p) {
    te["status"] = "available";
    te["emulates"] = "Transformer Engine AttnFuncWithCPAndKVP2P.backward";
    te["accumulation"] =
        "each ring step's (query CP rank, KV CP rank) gradients written in BF16; dq summed in "
        "BF16 on the query rank over KV ranks r+1, r+2, ..., r; dK/dV summed in BF16 with their "
        "K/V over query ranks s-1, s-2, ..., s (the backward ring, the diagonal last)";
    te["vs_fp32_reference"] = grads_json(b.te_p2p->dq, b.te_p2p->dk, b.te_p2p->dv);
    te["vs_canonical_bf16"] =
        grads_json(b.te_p2p->canonical_dq, b.te_p2p->canonical_dk, b.te_p2p->canonical_dv);
  } else {
    te["status"] = "not_requested";
    te["reason"] = "run with --include-lane-backward";
  }
  Value lanes = Value::object();
  lanes["te_p2p"] = std::move(te);
  drift["production_lanes"] = std::move(lanes);
  drift["provenance"] = backward_provenance(r, c);
  Value drifts = Value::array();
  drifts.push_back(std::move(drift));
  Value report = Value::object();
  report["reference_name"] = "cp1_backward_reference";
  report["drifts"] = std::move(drifts);
  v["status"] = "available";
  v["report"] = std::move(report);
  return v;
}

Value token_json(const TokenPair& t) {
  Value v = Value::object();
  v["sequence"] = t.sequence;
  v["position"] = t.position;
  v["cp_rank"] = t.cp_rank;
  v["logp_train"] = static_cast<double>(t.train);
  v["logp_rollout"] = static_cast<double>(t.rollout);
  v["delta"] = static_cast<double>(t.train) - static_cast<double>(t.rollout);
  v["shard_boundary_distance"] = t.shard_distance;
  v["split_boundary_distance"] = t.split_distance;
  return v;
}

Value abs_delta_bins_json(const std::vector<DistanceBin>& bins, const std::string& unit) {
  Value a = Value::array();
  for (const DistanceBin& b : bins) {
    Value v = Value::object();
    v["min_" + unit] = b.min;
    v["max_" + unit] = b.max < 0 ? Value() : Value(b.max);
    v["tokens"] = b.tokens;
    v["abs_delta_mean"] = b.abs_mean;
    v["abs_delta_max"] = b.abs_max;
    a.push_back(std::move(v));
  }
  return a;
}

// The RL frameworks' train/rollout figures over the active tokens (metrics/rl_metrics.h).
Value rl_metrics_json(const RlMetrics& m) {
  Value v = Value::object();
  v["sign_convention"] = "delta = logp_train - logp_rollout (candidate - reference)";
  v["tokens"] = m.tokens;
  Value a = Value::object();
  a["mean"] = m.abs_mean;
  a["std"] = m.abs_std;
  a["max"] = m.abs_max;
  a["p50"] = m.abs_p50;
  a["p99"] = m.abs_p99;
  v["abs_delta"] = std::move(a);
  Value r = Value::object();
  r["mean"] = m.ratio_mean;
  r["std"] = m.ratio_std;
  r["min"] = m.ratio_min;
  r["max"] = m.ratio_max;
  r["effective_sample_size"] = m.effective_sample_size;
  r["band"] = m.options.ratio_band;
  r["outside_band_fraction"] = m.outside_band_fraction;
  r["tis_clip"] = m.options.tis_clip;
  r["tis_clip_fraction"] = m.tis_clip_fraction;
  r["chi_squared"] = m.chi_squared;
  v["importance_ratio"] = std::move(r);
  Value kl = Value::object();
  kl["k1_mean"] = m.k1_mean;
  kl["k3_mean"] = m.k3_mean;
  kl["exact_mean"] = m.kl_exact_mean;
  v["kl_rollout_train"] = std::move(kl);
  Value ppl = Value::object();
  ppl["train"] = m.perplexity_train;
  ppl["rollout"] = m.perplexity_rollout;
  ppl["ratio"] = m.perplexity_rollout > 0 ? m.perplexity_train / m.perplexity_rollout : 0.0;
  v["perplexity"] = std::move(ppl);
  v["first_divergent_token"] = m.diverged ? token_json(m.first_divergent) : Value();
  Value worst = Value::array();
  for (const TokenPair& t : m.worst) worst.push_back(token_json(t));
  v["worst_tokens"] = std::move(worst);
  Value by = Value::object();
  by["cp_shard"] = abs_delta_bins_json(m.by_shard_distance, "distance");
  by["split"] = abs_delta_bins_json(m.by_split_distance, "distance");
  v["abs_delta_by_boundary_distance"] = std::move(by);
  return v;
}

namespace {

// A pair's verdict: what it had to show and whether it did.
const char* pair_status(const RolloutPair& p) {
  if (p.diagnostic) return "diagnostic";
  if (p.aligned) return p.bitwise_equal() ? "bitwise_equal" : "failed";
  return p.bitwise_equal() ? "equal_not_required" : "drift";
}

}  // namespace

Value rollout_pairs_json(const RunReport& r) {
  Value v = Value::object();
  if (r.rollout_pairs.empty()) {
    v["status"] = "not_applicable";
    v["reason"] =
        "needs prefill cases (the trainer) and paged cases (--modes paged_prefill,decode)";
    return v;
  }
  v["status"] = "available";
  v["positions"] = "every position the rollout decoded: the last q_len of each paged sequence";
  v["trainer_output"] = r.problem.dtype == DType::bf16 ? "bf16_kernel" : "fp32";
  v["trainer_merges"] =
      r.problem.dtype == DType::bf16
          ? "canonical (the global block order), and each production lane (production_lanes)"
          : "canonical (the global block order)";
  v["rollout_output"] = "paged candidate lane";
  v["logprob"] = "synthetic_fp32_lm_head_projection";
  v["aligned_means"] =
      "the row of every decoded position merges the same KV blocks on both sides: bits must be "
      "equal";
  v["vocab_size"] = r.paged_cases.empty() ? 0 : r.paged_cases.front().vocab_size;
  Value pairs = Value::array();
  for (const RolloutPair& p : r.rollout_pairs) {
    Value e = Value::object();
    e["trainer"] = p.trainer;
    e["trainer_merge"] = p.trainer_merge;
    e["rollout"] = p.rollout;
    e["aligned"] = p.aligned;
    e["bitwise_equal"] = p.bitwise_equal();
    e["status"] = pair_status(p);
    e["passed"] = p.passed();
    e["tokens"] = p.tokens;
    e["out"] = stats_json(p.out);
    e["lse"] = stats_json(p.lse);
    e["logprob"] = stats_json(p.logprob);
    e["rl_metrics"] = rl_metrics_json(p.rl);
    pairs.push_back(std::move(e));
  }
  v["pairs"] = std::move(pairs);
  return v;
}

Value dlogp_case_json(const CaseResult& c, DType dtype) {
  Value v = Value::object();
  if (!c.dlogp.available) {
    v["status"] = "not_requested";
    v["reason"] = "run with --include-dlogp";
    return v;
  }
  v["status"] = "available";
  v["projection"] = "synthetic_fp32_lm_head_projection";
  v["reference_cast_dtype"] = dtype == DType::bf16 ? "bfloat16" : "float32";
  v["candidate"] = dtype == DType::bf16 ? "bf16_cp_output" : "fp32_cp_output";
  v["vocab_size"] = c.dlogp.vocab_size;
  v["active_token_count"] = c.dlogp.drift.active_count;
  v["drift"] = stats_json(c.dlogp.drift);
  v["rl_metrics"] = rl_metrics_json(c.dlogp.rl);
  return v;
}

Value dlogp_root_json(const RunReport& r) {
  Value v = Value::object();
  v["source"] = "synthetic_fp32_lm_head_projection";
  if (r.vocab_size <= 0) {
    v["status"] = "not_requested";
    v["reason"] = "selected-token logprob drift is not requested (--include-dlogp)";
    return v;
  }
  v["status"] = "requested";
  v["reason"] = "requested with --include-dlogp";
  v["vocab_size"] = r.vocab_size;
  v["lm_head"] = "W[v, c] = normal(seed, lm_head, v*Hq*D + c) * fp32(1/sqrt(Hq*D)), FP32";
  v["hidden_layout"] = "[B, S, Hq*D] from out[B, Hq, S, D]";
  v["logit_sum_order"] = "per-head partials folded in ascending head order (TP ranks ascending)";
  v["target"] = "(b*S + s) mod V";
  v["active_tokens"] = "all but each sequence's first";
  return v;
}

}  // namespace cpd
