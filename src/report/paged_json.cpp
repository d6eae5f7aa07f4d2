// The report's paged cases (cpdrift extension `paged_cases[]`, docs/report-contract.md).
#include "report/plan_json.h"
#include "report/training_legs_json.h"

namespace cpd {

using json::Value;

namespace {

Value split_json(const SplitKv& s) {
  Value v = Value::object();
  v["policy"] = to_string(s.policy);
  v["split_size"] = s.policy == SplitPolicy::fixed ? Value(s.size) : Value(nullptr);
  return v;
}

Value plans_json(const PagedCaseResult& c) {
  Value plans = Value::array();
  for (int b = 0; b < c.workload.sequences(); ++b) {
    const std::vector<Range>& blocks = c.plans[static_cast<std::size_t>(b)];
    Value p = Value::object();
    p["sequence"] = b;
    p["kv_len"] = c.workload.kv_lens[static_cast<std::size_t>(b)];
    // Read off the blocks the lane ran with (auto's choice reads as a fixed cut at its size).
    const SplitKv& asked = c.spec.split;
    const SplitReading actual =
        read_split_plan({Range{0, c.workload.kv_lens[static_cast<std::size_t>(b)]}}, blocks,
                        asked.policy == SplitPolicy::fixed ? std::optional<std::int64_t>(asked.size)
                                                           : std::nullopt);
    p["actual_policy"] = actual.policy;
    p["actual_split_size"] = actual.size ? Value(*actual.size) : Value(nullptr);
    p["blocks"] = ranges_json(blocks);
    if (c.spec.split.policy == SplitPolicy::auto_select) {
      p["note"] = "auto: the size at the full context; each decode step picks its own";
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

}  // namespace

Value paged_case_json(const RunReport& r, const PagedCaseResult& c) {
  const PagedWorkload& w = c.workload;
  const Thresholds& t = r.thresholds;
  Value v = Value::object();
  v["case_name"] = c.name;
  v["attention_mode"] = to_string(c.spec.mode);

  Value paged = Value::object();
  Value shape = Value::object();
  shape["batch"] = w.sequences();
  Value lens = Value::array();
  for (const std::int64_t len : w.kv_lens) lens.push_back(len);
  shape["kv_lens"] = std::move(lens);
  shape["q_len"] = w.q_len;
  shape["query_rows"] = c.spec.mode == PagedMode::decode
                            ? "q_len decode steps, step t with context [0, t+1)"
                            : "one call of the last q_len positions";
  shape["num_query_heads"] = r.problem.dims.num_q_heads;
  shape["num_kv_heads"] = r.problem.dims.num_kv_heads;
  shape["head_dim"] = r.problem.dims.head_dim;
  shape["tp_world_size"] = c.spec.tp;
  paged["shape"] = std::move(shape);
  paged["page_size"] = w.page_size;
  paged["physical_pages"] = c.physical_pages;
  paged["shared_prompt_tokens"] = shared_prompt_len(r.problem);
  paged["shared_prefix_tokens"] = w.prefix_len;
  paged["shared_prefix_pages"] = w.prefix_pages();
  paged["block_tables_digest"] = c.block_tables_digest;
  paged["layout"] = "interleaved_allocation";

  Value split = Value::object();
  split["requested"] = split_json(c.spec.split);
  split["plans"] = plans_json(c);
  split["coverage_complete"] = c.coverage_errors.empty();
  Value errors = Value::array();
  for (const std::string& e : c.coverage_errors) errors.push_back(e);
  split["coverage_errors"] = std::move(errors);
  split["merge_order"] = "global_block_index";
  paged["split_kv"] = std::move(split);

  Value drift = Value::object();
  Value cand = out_lse_json(c.candidate);
  cand["reference"] = "fp32_full_logical_kv_same_inputs";
  cand["candidate"] =
      r.problem.dtype == DType::bf16 ? "bf16_inputs_bf16_p_bf16_final_write" : "fp32";
  drift["candidate"] = std::move(cand);
  Value fp32 = out_lse_json(c.fp32);
  fp32["reference"] = "fp32_full_logical_kv";
  fp32["source_class"] = "reduction_and_collective_drift";
  drift["fp32_split_merge"] = std::move(fp32);
  Value dlogp = stats_json(c.dlogp);
  dlogp["projection"] = "synthetic_fp32_lm_head_projection";
  dlogp["vocab_size"] = c.vocab_size;
  dlogp["reference_cast_dtype"] = r.problem.dtype == DType::bf16 ? "bfloat16" : "float32";
  dlogp["rl_metrics"] = rl_metrics_json(c.dlogp_rl);
  drift["dlogp"] = std::move(dlogp);
  paged["drift"] = std::move(drift);

  Value invariance = Value::object();
  const bool required = invariances_required(c.spec);
  for (const Invariance& inv : c.invariances) {
    Value i = out_lse_json(inv.stats);
    i["compares"] = inv.compares;
    i["bitwise_equal"] = inv.bitwise_equal();
    i["applicable"] = inv.applicable;
    if (!inv.applicable) i["reason"] = inv.reason;
    i["required"] = required && inv.applicable;
    // auto is a diagnostic: its equal bits are not evidence (they depend on batch and length).
    i["passed"] = required && inv.applicable && inv.bitwise_equal();
    if (!required) i["diagnostic"] = "split-KV auto depends on batch and length: never evidence";
    invariance[inv.name] = std::move(i);
  }
  paged["invariance"] = std::move(invariance);
  v["paged"] = std::move(paged);

  Value th = Value::object();
  th["out_max_abs"] = t.paged_out_max_abs;
  th["lse_max_abs"] = t.paged_lse_max_abs;
  th["dlogp_max_abs"] = t.paged_dlogp_max_abs;
  th["fp32_split_merge_max_abs"] = t.out_max_abs;
  th["invariance_max_abs"] = 0.0;
  v["thresholds"] = std::move(th);

  Value run = Value::object();
  run["seconds"] = c.seconds;
  run["processes_used"] = c.processes_used;
  run["work_split"] = "kv_heads_across_processes";
  v["execution"] = std::move(run);
  return v;
}

}  // namespace cpd
