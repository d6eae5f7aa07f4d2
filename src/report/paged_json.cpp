// The report's paged cases (cpdrift extension `paged_cases[]`, docs/report-contract.md).
#include "report/plan_json.h"

namespace cpd {

using json::array_of;
using json::Object;
using json::Value;

namespace {

Value plans_json(const PagedCaseResult& c) {
  Value plans = Value::array();
  const SplitKv& asked = c.spec.split;
  for (int b = 0; b < c.workload.sequences(); ++b) {
    const std::vector<Range>& blocks = c.plans[static_cast<std::size_t>(b)];
    const std::int64_t kv_len = c.workload.kv_lens[static_cast<std::size_t>(b)];
    // Read off the blocks the lane ran with (auto's choice reads as a fixed cut at its size).
    const SplitReading actual =
        read_split_plan({Range{0, kv_len}}, blocks,
                        asked.policy == SplitPolicy::fixed ? std::optional<std::int64_t>(asked.size)
                                                           : std::nullopt);
    Value p = Object{{"sequence", b},
                     {"kv_len", kv_len},
                     {"actual_policy", actual.policy},
                     {"actual_split_size", json::nullable(actual.size)},
                     {"blocks", ranges_json(blocks)}};
    if (asked.policy == SplitPolicy::auto_select) {
      p["note"] = "auto: the size at the full context; each decode step picks its own";
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

Value invariance_json(const Invariance& inv, bool required) {
  Value i = out_lse_json(inv.stats);
  i["compares"] = inv.compares;
  i["bitwise_equal"] = inv.bitwise_equal();
  i["applicable"] = inv.applicable;
  if (!inv.applicable) i["reason"] = inv.reason;
  i["required"] = required && inv.applicable;
  // auto is a diagnostic: its equal bits are not evidence (they depend on batch and length).
  i["passed"] = required && inv.applicable && inv.bitwise_equal();
  if (!required) i["diagnostic"] = "split-KV auto depends on batch and length: never evidence";
  return i;
}

Value paged_drift_json(const RunReport& r, const PagedCaseResult& c) {
  const bool bf16 = r.problem.dtype == DType::bf16;
  Value cand = out_lse_json(c.candidate);
  cand["reference"] = "fp32_full_logical_kv_same_inputs";
  cand["candidate"] = bf16 ? "bf16_inputs_bf16_p_bf16_final_write" : "fp32";
  Value fp32 = out_lse_json(c.fp32, "reduction_and_collective_drift");
  fp32["reference"] = "fp32_full_logical_kv";
  Value dlogp = stats_json(c.dlogp);
  dlogp["projection"] = "synthetic_fp32_lm_head_projection";
  dlogp["vocab_size"] = c.vocab_size;
  dlogp["reference_cast_dtype"] = torch_dtype_name(r.problem.dtype);
  dlogp["rl_metrics"] = rl_metrics_json(c.dlogp_rl);
  return Object{{"candidate", std::move(cand)},
                {"fp32_split_merge", std::move(fp32)},
                {"dlogp", std::move(dlogp)},
                // --scope layer: the layer's output of the candidate vs the reference cast alike.
                {"layer_out", c.layer ? stats_json(*c.layer) : Value()},
                // --scope layer: the candidate's layer output through the rollout's TP lanes.
                {"layer_tp_lanes", c.layer ? tp_lanes_json(c.layer_tp_lanes) : Value()}};
}

}  // namespace

Value paged_case_json(const RunReport& r, const PagedCaseResult& c) {
  const PagedWorkload& w = c.workload;
  const Thresholds& t = r.thresholds;
  const SplitKv& split = c.spec.split;
  Value invariance = Value::object();
  for (const Invariance& inv : c.invariances)
    invariance[inv.name] = invariance_json(inv, invariances_required(c.spec));
  const Value shape = Object{{"batch", w.sequences()},
                             {"kv_lens", array_of(w.kv_lens)},
                             {"q_len", w.q_len},
                             {"query_rows", c.spec.mode == PagedMode::decode
                                                ? "q_len decode steps, step t with context [0, t+1)"
                                                : "one call of the last q_len positions"},
                             {"num_query_heads", r.problem.dims.num_q_heads},
                             {"num_kv_heads", r.problem.dims.num_kv_heads},
                             {"head_dim", r.problem.dims.head_dim},
                             {"tp_world_size", c.spec.tp}};
  const Value split_kv = Object{
      {"requested",
       Object{{"policy", to_string(split.policy)},
              {"split_size", split.policy == SplitPolicy::fixed ? Value(split.size) : Value()}}},
      {"plans", plans_json(c)},
      {"coverage_complete", c.coverage_errors.empty()},
      {"coverage_errors", array_of(c.coverage_errors)},
      {"merge_order", "global_block_index"}};
  return Object{{"case_name", c.name},
                {"attention_mode", to_string(c.spec.mode)},
                {"paged", Object{{"shape", shape},
                                 {"page_size", w.page_size},
                                 {"physical_pages", c.physical_pages},
                                 {"shared_prompt_tokens", shared_prompt_len(r.problem)},
                                 {"shared_prefix_tokens", w.prefix_len},
                                 {"shared_prefix_pages", w.prefix_pages()},
                                 {"block_tables_digest", c.block_tables_digest},
                                 {"layout", "interleaved_allocation"},
                                 {"split_kv", split_kv},
                                 {"drift", paged_drift_json(r, c)},
                                 {"invariance", std::move(invariance)}}},
                {"thresholds", Object{{"out_max_abs", t.paged_out_max_abs},
                                      {"lse_max_abs", t.paged_lse_max_abs},
                                      {"dlogp_max_abs", t.paged_dlogp_max_abs},
                                      {"fp32_split_merge_max_abs", t.out_max_abs},
                                      {"invariance_max_abs", 0.0}}},
                {"execution", Object{{"seconds", c.seconds},
                                     {"processes_used", c.processes_used},
                                     {"work_split", "kv_heads_across_processes"}}}};
}

}  // namespace cpd
