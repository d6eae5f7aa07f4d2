// The drift report (kReportSchema): root blocks and the per-case drift sections.
#include "report/plan_json.h"
#include "report/production_lanes_json.h"
#include "report/run_report.h"
#include "report/training_legs_json.h"

namespace cpd {

using json::Array;
using json::Value;

Value out_lse_json(const OutLseStats& s, const char* source_class) {
  Value v = Value::object();
  v["out"] = stats_json(s.out);
  v["lse"] = stats_json(s.lse);
  if (source_class != nullptr) v["source_class"] = source_class;
  return v;
}

Value thresholds_json(const Thresholds& t) {
  Value v = Value::object();
  v["out_max_abs"] = t.out_max_abs;
  v["lse_max_abs"] = t.lse_max_abs;
  v["bf16_final_write_out_max_abs"] = t.bf16_write_max_abs;
  v["dlogp_max_abs"] = t.dlogp_max_abs;
  v["gradient_max_abs"] = t.gradient_max_abs;
  v["paged_out_max_abs"] = t.paged_out_max_abs;
  v["paged_lse_max_abs"] = t.paged_lse_max_abs;
  v["paged_dlogp_max_abs"] = t.paged_dlogp_max_abs;
  return v;
}

Value stats_json(const DiffStats& s) {
  Value v = Value::object();
  const bool ok = s.finite();
  v["max_abs"] = ok ? Value(s.max_abs) : Value(nullptr);
  v["mean_abs"] = ok ? Value(s.mean_abs) : Value(nullptr);
  v["p95_abs"] = ok ? Value(s.p95_abs) : Value(nullptr);
  v["p99_abs"] = ok ? Value(s.p99_abs) : Value(nullptr);
  v["active_count"] = s.active_count;
  v["bitwise_equal"] = s.bitwise_equal();
  v["mismatch_count"] = s.mismatch_count;
  v["max_ulp"] = s.max_ulp;
  v["digest"] = s.digest ? Value(*s.digest) : Value(nullptr);
  if (!ok) v["nonfinite_count"] = s.nonfinite_count;
  return v;
}

namespace {

// Transformer Engine's CP module, whose P2P ring the te_p2p lane emulates (docs/numerics.md
// section 10), and the three helpers of that merge the reference's probe looks for.
constexpr const char* kTeContextParallelModule =
    "transformer_engine.pytorch.attention.dot_product_attention.context_parallel";
constexpr const char* kTeMergeSymbols[] = {"flash_attn_fwd_softmax_lse_correction",
                                           "flash_attn_fwd_out_correction_init",
                                           "flash_attn_fwd_out_correction"};

bool ran_lane(const CaseResult& c, ProductionLane lane) {
  for (const LaneDrift& l : c.lanes) {
    if (l.lane == lane) return true;
  }
  return false;
}

Value rope_drift_json(const RunReport& r) {
  Value v = Value::object();
  if (!r.problem.rope) {
    v["status"] = "not_composed";
    v["q"] = nullptr;
    v["k"] = nullptr;
    return v;
  }
  v["status"] = "available";
  v["q"] = stats_json(r.rope.q);
  v["k"] = stats_json(r.rope.k);
  return v;
}

Value merge_probe_json(const OutLseStats& s) {
  Value v = Value::object();
  v["status"] = "available";
  v["arrival_order_policy"] = "ignored_then_sorted_by_global_block_index";
  v["arrival_order_tested"] = "reversed";
  v["out"] = stats_json(s.out);
  v["lse"] = stats_json(s.lse);
  v["bitwise_equal"] = s.bitwise_equal();
  v["mismatch_count"] = s.out.mismatch_count + s.lse.mismatch_count;
  return v;
}

Value per_rank_json(const PerRankDrift& p) {
  Value v = Value::object();
  v["rank"] = p.cp_rank;
  const bool one_range = p.tokens.size() == 1;
  v["query_start"] = one_range ? Value(p.tokens.front().begin) : Value(nullptr);
  v["query_end"] = one_range ? Value(p.tokens.front().end) : Value(nullptr);
  v["query_ranges"] = ranges_json(p.tokens);
  v["out"] = stats_json(p.candidate.out);
  v["lse"] = stats_json(p.candidate.lse);
  v["cp_merge_fp32"] = out_lse_json(p.cp_merge);
  return v;
}

// The case's real distributed run, or why there was none.
Value p2p_json(const RunReport& report, const CaseResult& c) {
  const CaseExecution& e = c.executed;
  Value v = Value::object();
  if (report.provenance.world_size == 1) {
    // The reference's words for a launch of one process (no process group to run it on).
    v["status"] = "not_requested";
    v["reason"] =
        "single process: the case's logical ranks exchanged their states in-process; launch "
        "with mpirun -np N for a distributed run";
    return v;
  }
  if (e.processes_used < 2) {
    v["status"] = "skipped";
    v["reason"] = "the case has a single logical rank, which ran on process 0 alone";
    return v;
  }
  v["status"] = "available";
  v["backend"] = e.transport;  // what moved the states between the processes
  v["transport"] = e.transport;
  v["world_size"] = report.provenance.world_size;
  v["processes_used"] = e.processes_used;
  v["manifest_block_count"] = e.block_bounds.size();
  Value owners = Value::array(), gathered = Value::array(), ranges = Value::array();
  for (int r = 0; r < c.spec.cp; ++r) {
    std::int64_t owned = 0;
    for (const ExecutedBlock& b : e.merged_blocks.front()) owned += b.owner_cp_rank == r ? 1 : 0;
    owners.push_back(owned);
    Value indices = Value::array();
    for (int i : e.merged_block_indices[static_cast<std::size_t>(r)]) indices.push_back(i);
    Value g = Value::object();
    g["query_owner_cp_rank"] = r;
    g["block_indices"] = std::move(indices);
    gathered.push_back(std::move(g));
    ranges.push_back(ranges_json(c.per_rank[static_cast<std::size_t>(r)].tokens));
  }
  v["owner_block_counts"] = std::move(owners);
  v["gathered_block_indices"] = std::move(gathered);
  v["query_range"] = std::move(ranges);
  v["out"] = stats_json(c.cp_merge_fp32.out);
  v["lse"] = stats_json(c.cp_merge_fp32.lse);
  return v;
}

}  // namespace

Value case_json(const RunReport& report, const CaseResult& c) {
  const Problem& p = report.problem;
  Value v = Value::object();
  v["case_name"] = c.name;
  v["model"] = "qwen3-8b";
  v["attention_mode"] = c.spec.split ? "chunked_prefill" : "prefill";
  v["topology"] = topology_json(p, c.spec, c.executed, report.provenance);
  v["provenance"] = case_provenance_json(p, c.spec, c.executed, report.provenance);

  Value drift = Value::object();
  drift["cp_merge_fp32"] = out_lse_json(c.cp_merge_fp32, "reduction_and_collective_drift");
  drift["dtype_path_vs_fp32"] = out_lse_json(c.dtype_path, "arithmetic_schedule_drift");
  drift["rope"] = rope_drift_json(report);
  drift["bf16_kernel"] = out_lse_json(c.bf16_kernel, "kernel_arithmetic_drift");
  if (c.cublas_unfused) {
    Value u = out_lse_json(*c.cublas_unfused, "unfused_gemm_drift");
    u["status"] = "available";
    u["kernel"] =
        "cublasGemmStridedBatchedEx bf16 in, fp32 compute; softmax kernel; atomics not allowed";
    drift["cublas_unfused"] = std::move(u);
  } else {
    Value u = Value::object();
    u["status"] = "unavailable";
    u["reason"] = "cuBLAS runs on the CUDA backend only (--device cuda)";
    drift["cublas_unfused"] = std::move(u);
  }
  Value topo = out_lse_json(c.topology);
  topo["reference_case"] = c.topology_reference;
  topo["bitwise_equal"] = c.topology.bitwise_equal();
  topo["required"] = c.topology_required;
  topo["reason"] = c.topology_required
                       ? "the block grid equals the CP=1 grid, so every bit must match"
                       : "the block grid differs from the CP=1 grid (split disabled or not "
                         "aligned to the CP owners): drift is reported, not required to be 0";
  drift["topology_invariance"] = std::move(topo);
  drift["production_lanes"] = lanes_case_json(c);
  v["drift"] = std::move(drift);

  v["merge_order_probe"] = merge_probe_json(c.merge_probe);
  Value gpu_cpu = Value::object();
  if (c.cuda_vs_cpu_fp32) {
    gpu_cpu["status"] = "available";
    gpu_cpu["bitwise_equal"] = c.cuda_vs_cpu_fp32->bitwise_equal();
    gpu_cpu["cuda_out_digest"] =
        c.cp_merge_fp32.out.digest ? Value(*c.cp_merge_fp32.out.digest) : Value(nullptr);
    gpu_cpu["cpu_out_digest"] =
        c.cuda_vs_cpu_fp32->out.digest ? Value(*c.cuda_vs_cpu_fp32->out.digest) : Value(nullptr);
    gpu_cpu["cuda_lse_digest"] =
        c.cp_merge_fp32.lse.digest ? Value(*c.cp_merge_fp32.lse.digest) : Value(nullptr);
    gpu_cpu["cpu_lse_digest"] =
        c.cuda_vs_cpu_fp32->lse.digest ? Value(*c.cuda_vs_cpu_fp32->lse.digest) : Value(nullptr);
    gpu_cpu["out"] = stats_json(c.cuda_vs_cpu_fp32->out);
    gpu_cpu["lse"] = stats_json(c.cuda_vs_cpu_fp32->lse);
  } else {
    gpu_cpu["status"] = "not_applicable";
    gpu_cpu["reason"] = report.provenance.device == "cpu"
                            ? "the case ran on the CPU backend"
                            : "the CPU comparison was switched off (--no-cpu-check)";
  }
  v["cuda_vs_cpu_fp32"] = std::move(gpu_cpu);
  Value te = Value::object();
  te["status"] = "unavailable";
  te["te_module"] = kTeContextParallelModule;  // what te_p2p emulates; never imported
  te["fallback"] = "deterministic_cp_reference";
  te["te_p2p_lane"] =
      ran_lane(c, ProductionLane::te_p2p) ? Value("drift.production_lanes.te_p2p") : Value(nullptr);
  v["te_merge_oracle"] = std::move(te);
  v["merge_oracle"] = out_lse_json(c.merge_oracle);

  Value per_rank = Value::array();
  for (const PerRankDrift& pr : c.per_rank) per_rank.push_back(per_rank_json(pr));
  v["per_rank"] = std::move(per_rank);

  v["backward"] = backward_json(report, c);
  v["dlogp"] = dlogp_case_json(c, report.problem.dtype);
  v["distributed_p2p_reference"] = p2p_json(report, c);

  Value run = Value::object();
  run["seconds"] = c.seconds;
  run["messages"] = c.executed.moved.messages;
  run["bytes_moved"] = c.executed.moved.bytes;
  run["bytes_between_processes"] = c.executed.moved.remote_bytes;
  v["execution"] = std::move(run);
  return v;
}

namespace {

// The problem the run measured: the model's shape, the inputs.
Value target_json(const Problem& p) {
  Value target = Value::object();
  target["model"] = "qwen3-8b";
  target["global_num_query_heads"] = p.dims.num_q_heads;
  target["global_num_kv_heads"] = p.dims.num_kv_heads;
  target["head_dim"] = p.dims.head_dim;
  target["dtype"] = to_string(p.dtype);
  target["batch"] = p.batch;
  target["seq_len"] = p.seq_len;
  // Every sequence's q, k and v rows before it are sequence 0's (one prompt, several responses).
  target["shared_prompt_tokens"] = shared_prompt_len(p);
  target["causal"] = true;
  target["seed"] = p.seed;
  // Generated inputs: their distribution; a file's (--inputs): "file" and what it was.
  target["input_distribution"] = p.inputs ? "file" : to_string(p.distribution);
  if (p.inputs) {
    const InputFileInfo& f = p.inputs->info();
    Value in = Value::object();
    in["path"] = f.path;
    in["format"] = f.format;
    in["dtype"] = f.dtype;
    in["size_bytes"] = f.size_bytes;
    in["sha256"] = f.sha256;
    in["rope_applied"] = f.rope_applied;
    in["positions"] = f.positions ? "from the file" : "token index";
    target["inputs"] = std::move(in);
  } else {
    target["inputs"] = Value();
  }
  return target;
}

// Transformer Engine's CP merge: not run; its ring emulated as the te_p2p lane.
Value te_merge_json(const RunReport& r) {
  Value te = Value::object();
  te["te_available"] = false;
  te["te_capability_probe"] = "unavailable";
  te["te_version"] = nullptr;
  // The module and helpers whose merge order and precision the te_p2p lane reproduces; nothing
  // is imported, so no signature is checked and no numeric self-test of TE runs.
  te["te_module"] = kTeContextParallelModule;
  Value symbols = Value::array();
  for (const char* name : kTeMergeSymbols) symbols.push_back(name);
  te["te_symbols"] = std::move(symbols);
  te["te_signature_checked"] = false;
  te["te_numeric_selftest"] = "unavailable";
  std::size_t te_lane_cases = 0;
  for (const CaseResult& c : r.cases) te_lane_cases += ran_lane(c, ProductionLane::te_p2p) ? 1 : 0;
  Value emulation = Value::object();
  emulation["lane"] = "te_p2p";
  emulation["imported"] = false;
  emulation["cases"] = te_lane_cases;
  te["te_emulation"] = std::move(emulation);
  te["fallback"] = true;
  te["fallback_reason"] =
      "Transformer Engine is a PyTorch/CUDA library that cpdrift does not use; its merge is "
      "checked by cpdrift's own FP64 oracle (see merge_oracle), and its P2P ring's merge order "
      "and precision are emulated as the te_p2p lane (see production_lanes)";
  return te;
}

// The FP64 merge oracle: its self-test and the worst drift of any case against it.
Value merge_oracle_json(const RunReport& r) {
  Value oracle = Value::object();
  oracle["status"] = "available";
  oracle["formulation"] = "fp64_global_max_then_single_weighted_sum";
  oracle["compared_with"] = "fp32_left_fold_in_global_block_index_order";
  oracle["self_test"] = r.merge_oracle_self_test.empty() ? "passed" : "failed";
  oracle["self_test_error"] =
      r.merge_oracle_self_test.empty() ? Value(nullptr) : Value(r.merge_oracle_self_test);
  oracle["tolerance"] = r.thresholds.lse_max_abs;
  double worst_out = 0.0, worst_lse = 0.0;
  for (const CaseResult& c : r.cases) {
    worst_out = std::max(worst_out, c.merge_oracle.out.finite() ? c.merge_oracle.out.max_abs : 0.0);
    worst_lse = std::max(worst_lse, c.merge_oracle.lse.finite() ? c.merge_oracle.lse.max_abs : 0.0);
  }
  oracle["max_out_abs"] = worst_out;
  oracle["max_lse_abs"] = worst_lse;
  return oracle;
}

Value summary_json(const RunReport& r) {
  Value summary = Value::object();
  summary["passed"] = r.passed();
  Value failed = Value::array();
  for (const std::string& f : r.failed_checks) failed.push_back(f);
  summary["failed_checks"] = std::move(failed);
  summary["wall_seconds"] = r.wall_seconds;
  Value rss = Value::array();
  for (const std::uint64_t bytes : r.peak_rss_bytes) rss.push_back(bytes);
  summary["peak_rss_bytes_per_process"] = std::move(rss);
  summary["case_count"] = r.cases.size();
  summary["paged_case_count"] = r.paged_cases.size();
  summary["trainer_vs_rollout_pair_count"] = r.rollout_pairs.size();
  return summary;
}

}  // namespace

Value report_json(const RunReport& r) {
  const Provenance& pv = r.provenance;
  Value v = Value::object();
  v["schema_version"] = kReportSchema;
  v["report_family"] = "ws2_cross_config_drift_report";
  v["tolerance_source"] = "#108";
  v["issue"] = 235;
  v["pr"] = 5;
  v["created_at_utc"] = pv.created_at_utc;
  v["launch"] = launch_json(pv);
  v["runtime"] = runtime_json(pv);
  v["target"] = target_json(r.problem);
  v["te_context_parallel_merge"] = te_merge_json(r);
  v["merge_oracle"] = merge_oracle_json(r);
  v["dlogp"] = dlogp_root_json(r);
  v["thresholds"] = thresholds_json(r.thresholds);

  Value cases = Value::array();
  for (const CaseResult& c : r.cases) cases.push_back(case_json(r, c));
  v["cases"] = std::move(cases);
  Value paged = Value::array();
  for (const PagedCaseResult& c : r.paged_cases) paged.push_back(paged_case_json(r, c));
  v["paged_cases"] = std::move(paged);
  v["trainer_vs_rollout"] = rollout_pairs_json(r);
  v["production_lanes"] = production_lanes_json(r);
  v["summary"] = summary_json(r);
  return v;
}

}  // namespace cpd
