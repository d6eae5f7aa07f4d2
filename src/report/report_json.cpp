// The drift report (kReportSchema): root blocks and the per-case drift sections, the production
// lanes' included.
#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "report/plan_json.h"

namespace cpd {

using json::array_of;
using json::Object;
using json::Value;

Value out_lse_json(const OutLseStats& s, const char* source_class) {
  Value v = Object{{"out", stats_json(s.out)}, {"lse", stats_json(s.lse)}};
  if (source_class != nullptr) v["source_class"] = source_class;
  return v;
}

Value thresholds_json(const Thresholds& t) {
  return Object{{"out_max_abs", t.out_max_abs},
                {"lse_max_abs", t.lse_max_abs},
                {"bf16_final_write_out_max_abs", t.bf16_write_max_abs},
                {"dlogp_max_abs", t.dlogp_max_abs},
                {"gradient_max_abs", t.gradient_max_abs},
                {"paged_out_max_abs", t.paged_out_max_abs},
                {"paged_lse_max_abs", t.paged_lse_max_abs},
                {"paged_dlogp_max_abs", t.paged_dlogp_max_abs}};
}

Value stats_json(const DiffStats& s) {
  Value v =
      Object{{"max_abs", finite_or_null(s, s.max_abs)}, {"mean_abs", finite_or_null(s, s.mean_abs)},
             {"p95_abs", finite_or_null(s, s.p95_abs)}, {"p99_abs", finite_or_null(s, s.p99_abs)},
             {"active_count", s.active_count},          {"bitwise_equal", s.bitwise_equal()},
             {"mismatch_count", s.mismatch_count},      {"max_ulp", s.max_ulp},
             {"digest", json::nullable(s.digest)}};
  if (!s.finite()) v["nonfinite_count"] = s.nonfinite_count;
  return v;
}

Value finite_or_null(const DiffStats& s, double figure) {
  return s.finite() ? Value(figure) : Value(nullptr);
}

Value status_json(const char* status, const char* reason) {
  return Object{{"status", status}, {"reason", reason}};
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
  return std::any_of(c.lanes.begin(), c.lanes.end(),
                     [lane](const LaneDrift& l) { return l.lane == lane; });
}

// The production lanes (numerics.md section 10): per case, each emulated stack's merge vs the
// FP32 reference and vs the canonical merge of the same states; per lane, how it varies across
// the run's topologies where the canonical grid does not.
const char* lane_stack(ProductionLane l) {
  switch (l) {
    case ProductionLane::te_p2p:
      return "Transformer Engine P2P ring (AttnFuncWithCPAndKVP2P): ring order, LSE folded in "
             "FP32 with log1p, running output in BF16";
    case ProductionLane::ring_fp32:
      return "ring-flash-attention (_update_out_and_lse): ring order, FP32 running output, "
             "sigmoid update";
    case ProductionLane::nccl_rs:
      return "vLLM decode CP (cp_lse_ag_out_rs): outputs rescaled into BF16, summed by a ring "
             "reduce-scatter in BF16";
  }
  return "?";
}

// A topology group: the cases of the same layout and split (0: none), so that only TP and CP
// differ; ordered by layout, then split.
using GroupKey = std::pair<std::string, std::int64_t>;
struct Group {
  std::size_t cases = 0;
  std::set<std::string> lane_digests, canonical_digests;
};

Value lane_case_json(const CaseResult& c, const LaneDrift& d) {
  const DiffStats& lane_out = d.vs_reference.out;
  const DiffStats& canonical_out = c.bf16_kernel.out;
  return Object{
      {"case_name", c.name},
      {"tp", c.spec.tp},
      {"cp", c.spec.cp},
      {"out_max_abs_vs_fp32", finite_or_null(lane_out, lane_out.max_abs)},
      {"out_mean_abs_vs_fp32", finite_or_null(lane_out, lane_out.mean_abs)},
      {"canonical_out_max_abs_vs_fp32", finite_or_null(canonical_out, canonical_out.max_abs)},
      {"canonical_out_mean_abs_vs_fp32", finite_or_null(canonical_out, canonical_out.mean_abs)},
      {"out_mismatches_vs_canonical", d.vs_canonical.out.mismatch_count},
      {"bitwise_equal_canonical", d.vs_canonical.bitwise_equal()},
      {"out_digest", json::nullable(lane_out.digest)}};
}

// A case's `drift.production_lanes`: each lane vs the FP32 reference and vs the canonical merge.
Value lanes_case_json(const CaseResult& c) {
  Value v = Value::object();
  for (const LaneDrift& l : c.lanes) {
    Value canon = out_lse_json(l.vs_canonical);
    canon["bitwise_equal"] = l.vs_canonical.bitwise_equal();
    v[to_string(l.lane)] =
        Object{{"vs_fp32_reference", out_lse_json(l.vs_reference, "production_merge_drift")},
               {"vs_canonical_bf16_kernel", std::move(canon)}};
  }
  return v;
}

// The report's `production_lanes`: what each lane emulates, its figure per case, and its
// distinct digests per (layout, split) group of cases beside the canonical merge's.
Value production_lanes_json(const RunReport& r) {
  Value lanes = Value::object();
  for (const ProductionLane lane : kProductionLanes) {
    Value cases = Value::array();
    std::map<GroupKey, Group> groups;
    for (const CaseResult& c : r.cases) {
      for (const LaneDrift& d : c.lanes) {
        if (d.lane != lane) continue;
        cases.push_back(lane_case_json(c, d));
        Group& g = groups[{to_string(c.spec.layout), c.spec.split.value_or(0)}];
        ++g.cases;
        if (d.vs_reference.out.digest) g.lane_digests.insert(*d.vs_reference.out.digest);
        if (c.bf16_kernel.out.digest) g.canonical_digests.insert(*c.bf16_kernel.out.digest);
      }
    }
    Value variance = Value::array();
    for (const auto& [key, g] : groups) {
      const std::string split = key.second > 0 ? std::to_string(key.second) : "none";
      variance.push_back(Object{{"layout_and_split", key.first + ", split " + split},
                                {"cases", g.cases},
                                {"distinct_out_digests", g.lane_digests.size()},
                                {"canonical_distinct_out_digests", g.canonical_digests.size()}});
    }
    lanes[to_string(lane)] = Object{{"stack", lane_stack(lane)},
                                    {"cases", std::move(cases)},
                                    {"topology_variance", std::move(variance)}};
  }
  return Object{
      {"states",
       "the bf16_kernel path's partial states: each CP rank's blocks folded in block order (its "
       "kernel call), written as BF16, then merged as the stack does (docs/numerics.md section "
       "10)"},
      {"ring_order",
       "step i on CP rank r holds the K/V of rank (r - i) mod CP, the diagonal first"},
      {"lanes", std::move(lanes)}};
}

Value rope_drift_json(const RunReport& r) {
  if (!r.problem.rope) return Object{{"status", "not_composed"}, {"q", nullptr}, {"k", nullptr}};
  return Object{{"status", "available"}, {"q", stats_json(r.rope.q)}, {"k", stats_json(r.rope.k)}};
}

Value merge_probe_json(const OutLseStats& s) {
  Value v = out_lse_json(s);
  v["status"] = "available";
  v["arrival_order_policy"] = "ignored_then_sorted_by_global_block_index";
  v["arrival_order_tested"] = "reversed";
  v["bitwise_equal"] = s.bitwise_equal();
  v["mismatch_count"] = s.out.mismatch_count + s.lse.mismatch_count;
  return v;
}

Value per_rank_json(const PerRankDrift& p) {
  const bool one_range = p.tokens.size() == 1;
  Value v = out_lse_json(p.candidate);
  v["rank"] = p.cp_rank;
  v["query_start"] = one_range ? Value(p.tokens.front().begin) : Value(nullptr);
  v["query_end"] = one_range ? Value(p.tokens.front().end) : Value(nullptr);
  v["query_ranges"] = ranges_json(p.tokens);
  v["cp_merge_fp32"] = out_lse_json(p.cp_merge);
  return v;
}

// The case's real distributed run, or why there was none.
Value p2p_json(const RunReport& report, const CaseResult& c) {
  const CaseExecution& e = c.executed;
  if (report.provenance.world_size == 1) {
    // The reference's words for a launch of one process (no process group to run it on).
    return status_json("not_requested",
                       "single process: the case's logical ranks exchanged their states "
                       "in-process; launch with mpirun -np N for a distributed run");
  }
  if (e.processes_used < 2) {
    return status_json("skipped",
                       "the case has a single logical rank, which ran on process 0 alone");
  }
  Value owners = Value::array(), gathered = Value::array(), ranges = Value::array();
  for (int r = 0; r < c.spec.cp; ++r) {
    ranges.push_back(ranges_json(c.per_rank[static_cast<std::size_t>(r)].tokens));
    owners.push_back(std::count_if(e.merged_blocks.front().begin(), e.merged_blocks.front().end(),
                                   [r](const ExecutedBlock& b) { return b.owner_cp_rank == r; }));
    gathered.push_back(
        Object{{"query_owner_cp_rank", r},
               {"block_indices", array_of(e.merged_block_indices[static_cast<std::size_t>(r)])}});
  }
  Value v = out_lse_json(c.cp_merge_fp32);
  v["status"] = "available";
  v["backend"] = e.transport;  // what moved the states between the processes
  v["transport"] = e.transport;
  v["world_size"] = report.provenance.world_size;
  v["processes_used"] = e.processes_used;
  v["manifest_block_count"] = e.block_bounds.size();
  v["owner_block_counts"] = std::move(owners);
  v["gathered_block_indices"] = std::move(gathered);
  v["query_range"] = std::move(ranges);
  return v;
}

Value cublas_json(const CaseResult& c) {
  if (!c.cublas_unfused) {
    return status_json("unavailable", "cuBLAS runs on the CUDA backend only (--device cuda)");
  }
  Value u = out_lse_json(*c.cublas_unfused, "unfused_gemm_drift");
  u["status"] = "available";
  u["kernel"] =
      "cublasGemmStridedBatchedEx bf16 in, fp32 compute; softmax kernel; atomics not allowed";
  return u;
}

Value topology_invariance_json(const CaseResult& c) {
  Value topo = out_lse_json(c.topology);
  topo["reference_case"] = c.topology_reference;
  topo["bitwise_equal"] = c.topology.bitwise_equal();
  topo["required"] = c.topology_required;
  topo["reason"] = c.topology_required
                       ? "the block grid equals the CP=1 grid, so every bit must match"
                       : "the block grid differs from the CP=1 grid (split disabled or not "
                         "aligned to the CP owners): drift is reported, not required to be 0";
  return topo;
}

Value cuda_vs_cpu_json(const RunReport& report, const CaseResult& c) {
  if (!c.cuda_vs_cpu_fp32) {
    return status_json("not_applicable",
                       report.provenance.device == "cpu"
                           ? "the case ran on the CPU backend"
                           : "the CPU comparison was switched off (--no-cpu-check)");
  }
  const OutLseStats& cpu = *c.cuda_vs_cpu_fp32;
  Value v = out_lse_json(cpu);
  v["status"] = "available";
  v["bitwise_equal"] = cpu.bitwise_equal();
  v["cuda_out_digest"] = json::nullable(c.cp_merge_fp32.out.digest);
  v["cpu_out_digest"] = json::nullable(cpu.out.digest);
  v["cuda_lse_digest"] = json::nullable(c.cp_merge_fp32.lse.digest);
  v["cpu_lse_digest"] = json::nullable(cpu.lse.digest);
  return v;
}

}  // namespace

Value case_json(const RunReport& report, const CaseResult& c) {
  const Problem& p = report.problem;
  const bool te_lane = ran_lane(c, ProductionLane::te_p2p);
  return Object{
      {"case_name", c.name},
      {"model", p.dims.name},
      {"attention_mode", c.spec.split ? "chunked_prefill" : "prefill"},
      {"topology", topology_json(p, c.spec, c.executed, report.provenance)},
      {"provenance", case_provenance_json(p, c.spec, c.executed, report.provenance)},
      {"drift",
       Object{{"cp_merge_fp32", out_lse_json(c.cp_merge_fp32, "reduction_and_collective_drift")},
              {"dtype_path_vs_fp32", out_lse_json(c.dtype_path, "arithmetic_schedule_drift")},
              {"rope", rope_drift_json(report)},
              {"bf16_kernel", out_lse_json(c.bf16_kernel, "kernel_arithmetic_drift")},
              {"cublas_unfused", cublas_json(c)},
              {"topology_invariance", topology_invariance_json(c)},
              {"production_lanes", lanes_case_json(c)}}},
      {"merge_order_probe", merge_probe_json(c.merge_probe)},
      {"cuda_vs_cpu_fp32", cuda_vs_cpu_json(report, c)},
      {"te_merge_oracle",
       Object{{"status", "unavailable"},
              {"te_module", kTeContextParallelModule},  // what te_p2p emulates; never imported
              {"fallback", "deterministic_cp_reference"},
              {"te_p2p_lane", te_lane ? Value("drift.production_lanes.te_p2p") : Value(nullptr)}}},
      {"merge_oracle", out_lse_json(c.merge_oracle)},
      {"per_rank", array_of(c.per_rank, per_rank_json)},
      {"backward", backward_json(report, c)},
      {"layer", layer_case_json(report, c)},
      {"dlogp", dlogp_case_json(c, report.problem)},
      {"distributed_p2p_reference", p2p_json(report, c)},
      {"execution", Object{{"seconds", c.seconds},
                           {"messages", c.executed.moved.messages},
                           {"bytes_moved", c.executed.moved.bytes},
                           {"bytes_between_processes", c.executed.moved.remote_bytes}}}};
}

namespace {

// The file the inputs came from (--inputs).
Value inputs_json(const InputFileInfo& f) {
  return Object{{"path", f.path},
                {"format", f.format},
                {"dtype", f.dtype},
                {"size_bytes", f.size_bytes},
                {"sha256", f.sha256},
                {"tensors", f.hidden ? "hidden" : "q, k, v"},
                {"rope_applied", f.rope_applied},
                {"positions", f.positions ? "from the file" : "token index"}};
}

// The model's description and where it came from (docs/models.md), in config.json's names.
Value model_json(const ModelDims& m) {
  return Object{{"name", m.name},
                {"source", m.source},
                {"hidden_size", m.hidden_size},
                {"num_attention_heads", m.num_q_heads},
                {"num_key_value_heads", m.num_kv_heads},
                {"head_dim", m.head_dim},
                {"rope_theta", m.rope.theta},
                {"rope_scaling", rope_scaling_json(m.rope)},
                {"qk_norm", m.qk_norm},
                {"qkv_bias", m.qkv_bias},
                {"rms_norm_eps", m.rms_norm_eps},
                {"vocab_size", m.vocab_size}};
}

// The problem the run measured: the model's shape, the inputs.
Value target_json(const Problem& p) {
  return Object{
      {"model", p.dims.name},
      {"model_config", model_json(p.dims)},
      {"global_num_query_heads", p.dims.num_q_heads},
      {"global_num_kv_heads", p.dims.num_kv_heads},
      {"head_dim", p.dims.head_dim},
      {"dtype", to_string(p.dtype)},
      {"batch", p.batch},
      {"seq_len", p.seq_len},
      // Every sequence's q, k and v rows before it are sequence 0's (one prompt, several
      // responses).
      {"shared_prompt_tokens", shared_prompt_len(p)},
      {"causal", true},
      {"seed", p.seed},
      // Generated inputs: their distribution; a file's (--inputs): "file" and what it was.
      {"input_distribution", p.inputs ? "file" : to_string(p.distribution)},
      {"inputs", p.inputs ? inputs_json(p.inputs->info()) : Value()},
      // core: q, k, v → out; layer: hidden → q/k/v_proj → norms → RoPE → attention → o_proj.
      {"scope", p.layer ? "layer" : "core"}};
}

// Transformer Engine's CP merge: not run; its ring emulated as the te_p2p lane.
Value te_merge_json(const RunReport& r) {
  const auto te_lane_cases = std::count_if(r.cases.begin(), r.cases.end(), [](const CaseResult& c) {
    return ran_lane(c, ProductionLane::te_p2p);
  });
  return Object{
      {"te_available", false},
      {"te_capability_probe", "unavailable"},
      {"te_version", nullptr},
      // The module and helpers whose merge order and precision the te_p2p lane reproduces;
      // nothing is imported, so no signature is checked and no numeric self-test of TE runs.
      {"te_module", kTeContextParallelModule},
      {"te_symbols", array_of(kTeMergeSymbols)},
      {"te_signature_checked", false},
      {"te_numeric_selftest", "unavailable"},
      {"te_emulation", Object{{"lane", "te_p2p"}, {"imported", false}, {"cases", te_lane_cases}}},
      {"fallback", true},
      {"fallback_reason",
       "Transformer Engine is a PyTorch/CUDA library that cpdrift does not use; its merge is "
       "checked by cpdrift's own FP64 oracle (see merge_oracle), and its P2P ring's merge order "
       "and precision are emulated as the te_p2p lane (see production_lanes)"}};
}

// The FP64 merge oracle: its self-test and the worst drift of any case against it.
Value merge_oracle_json(const RunReport& r) {
  double worst_out = 0.0, worst_lse = 0.0;
  for (const CaseResult& c : r.cases) {
    worst_out = std::max(worst_out, c.merge_oracle.out.finite() ? c.merge_oracle.out.max_abs : 0.0);
    worst_lse = std::max(worst_lse, c.merge_oracle.lse.finite() ? c.merge_oracle.lse.max_abs : 0.0);
  }
  const bool passed = r.merge_oracle_self_test.empty();
  return Object{{"status", "available"},
                {"formulation", "fp64_global_max_then_single_weighted_sum"},
                {"compared_with", "fp32_left_fold_in_global_block_index_order"},
                {"self_test", passed ? "passed" : "failed"},
                {"self_test_error", passed ? Value(nullptr) : Value(r.merge_oracle_self_test)},
                {"tolerance", r.thresholds.lse_max_abs},
                {"max_out_abs", worst_out},
                {"max_lse_abs", worst_lse}};
}

Value summary_json(const RunReport& r) {
  return Object{{"passed", r.passed()},
                {"failed_checks", array_of(r.failed_checks)},
                {"wall_seconds", r.wall_seconds},
                {"peak_rss_bytes_per_process", array_of(r.peak_rss_bytes)},
                {"case_count", r.cases.size()},
                {"paged_case_count", r.paged_cases.size()},
                {"trainer_vs_rollout_pair_count", r.rollout_pairs.size()}};
}

}  // namespace

Value report_json(const RunReport& r) {
  const auto paged = [&r](const PagedCaseResult& c) { return paged_case_json(r, c); };
  return Object{{"schema_version", kReportSchema},
                {"report_family", "ws2_cross_config_drift_report"},
                {"tolerance_source", "#108"},
                {"issue", 235},
                {"pr", 5},
                {"created_at_utc", r.provenance.created_at_utc},
                {"launch", launch_json(r.provenance)},
                {"runtime", runtime_json(r.provenance)},
                {"target", target_json(r.problem)},
                {"te_context_parallel_merge", te_merge_json(r)},
                {"merge_oracle", merge_oracle_json(r)},
                {"dlogp", dlogp_root_json(r)},
                {"thresholds", thresholds_json(r.thresholds)},
                {"cases", array_of(r.cases, [&r](const CaseResult& c) { return case_json(r, c); })},
                {"paged_cases", array_of(r.paged_cases, paged)},
                {"trainer_vs_rollout", rollout_pairs_json(r)},
                {"production_lanes", production_lanes_json(r)},
                {"summary", summary_json(r)}};
}

}  // namespace cpd
