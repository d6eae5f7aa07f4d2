// The report against report-contract.md: every compatible field is present with the right
// type, the checks fail closed, and the contract's example hashes come out of a real run.
#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include "engine/backward.h"
#include "engine/case_runner.h"
#include "engine/merge_checks.h"
#include "recorded_run.h"
#include "report/run_report.h"

using namespace cpd;
using json::Value;

namespace {

// Follows a dotted path ("a.b.c"); fails the test when a key is missing.
// A C string, not std::string: a temporary argument would make g++ 13 warn (-Wdangling-reference)
// wherever the result binds a reference.
const Value& at_path(const Value& root, const char* path) {
  const Value* v = &root;
  std::stringstream ss(path);
  std::string key;
  while (std::getline(ss, key, '.')) {
    REQUIRE_MESSAGE(v->is_object(), path << ": " << key << " is not inside an object");
    REQUIRE_MESSAGE(v->contains(key), "missing field " << path);
    v = &v->at(key);
  }
  return *v;
}

void require_stats(const Value& s, const std::string& where) {
  CAPTURE(where);
  for (const char* k : {"max_abs", "mean_abs", "p95_abs", "p99_abs"})
    CHECK(at_path(s, k).is_number());
  for (const char* k : {"active_count", "mismatch_count", "max_ulp"})
    CHECK(at_path(s, k).is_integer());
  CHECK(at_path(s, "bitwise_equal").is_bool());
  CHECK(s.contains("digest"));
}

// A one-process run of S = 16: everything a RunContext points at.
struct LocalRun {
  Problem p = [] {
    Problem q;
    q.seq_len = 16;
    return q;
  }();
  ThreadPool pool{2};
  InputStore inputs{p, pool};
  InProcessTransport transport;
  LocalCp1Results cp1;
  const LocalCollectives local;
  RunContext ctx{p, pool, inputs, transport, local, cp1};
};

RunReport small_run(const std::vector<CaseSpec>& specs) {
  LocalRun run;
  LocalCp1Backward cp1_backward;
  RunContext& ctx = run.ctx;
  ctx.cp1_backward = &cp1_backward;
  ctx.vocab_size = 17;
  const Problem& p = run.p;
  RunReport r;
  r.problem = p;
  r.vocab_size = 17;
  r.provenance.command = "cpdrift --test";
  r.provenance.launcher = "direct";
  r.provenance.transport = run.transport.name();
  r.provenance.created_at_utc = "2026-01-01T00:00:00Z";
  r.merge_oracle_self_test = merge_oracle_self_test();
  r.rope = testing::recorded_rope(ctx);
  for (const CaseSpec& s : specs) r.cases.push_back(testing::recorded_case(ctx, s));
  r.failed_checks = evaluate_checks(r);
  return r;
}

}  // namespace

TEST_CASE("every compatible field of the contract is present") {
  const RunReport r =
      small_run({CaseSpec{2, 2, std::nullopt, CpLayout::contiguous, Protocol::ag_rs},
                 CaseSpec{2, 2, 4, CpLayout::zigzag, Protocol::ag_rs}});
  const Value v = json::parse(json::to_string(report_json(r)));
  CHECK(at_path(v, "schema_version").as_string() == "ws2_cp_attention_drift/v2");
  CHECK(at_path(v, "report_family").as_string() == "ws2_cross_config_drift_report");
  CHECK(at_path(v, "tolerance_source").as_string() == "#108");
  CHECK(at_path(v, "issue").as_int64() == 235);
  CHECK(at_path(v, "pr").as_int64() == 5);
  for (const char* k : {"created_at_utc",
                        "launch.command",
                        "launch.rank",
                        "launch.world_size",
                        "launch.local_rank",
                        "launch.launcher",
                        "runtime.device",
                        "runtime.cuda_available",
                        "runtime.distributed.initialized",
                        "runtime.distributed.backend",
                        "runtime.distributed.transport",
                        "runtime.rank_env",
                        "runtime.compiler",
                        "runtime.mpi_version",
                        "runtime.nccl_version",
                        "runtime.cuda_version",
                        "runtime.hdf5_version",
                        "runtime.git_describe",
                        "target.seed",
                        "te_context_parallel_merge.fallback_reason",
                        "merge_oracle.self_test",
                        "dlogp.source",
                        "summary.failed_checks",
                        "summary.wall_seconds"}) {
    CAPTURE(k);
    at_path(v, k);
  }
  CHECK(at_path(v, "target.model").as_string() == "qwen3-8b");
  CHECK(at_path(v, "target.global_num_query_heads").as_int64() == 32);
  CHECK(at_path(v, "target.global_num_kv_heads").as_int64() == 8);
  CHECK(at_path(v, "target.head_dim").as_int64() == 128);
  CHECK(at_path(v, "target.causal").as_bool());
  CHECK_FALSE(at_path(v, "te_context_parallel_merge.te_available").as_bool());
  CHECK(at_path(v, "te_context_parallel_merge.te_capability_probe").as_string() == "unavailable");
  CHECK(at_path(v, "te_context_parallel_merge.te_module").as_string() ==
        "transformer_engine.pytorch.attention.dot_product_attention.context_parallel");
  CHECK(at_path(v, "te_context_parallel_merge.te_symbols").size() == 3u);
  CHECK_FALSE(at_path(v, "te_context_parallel_merge.te_signature_checked").as_bool());
  CHECK(at_path(v, "te_context_parallel_merge.te_numeric_selftest").as_string() == "unavailable");
  CHECK(at_path(v, "te_context_parallel_merge.te_emulation.cases").as_int64() == 2);
  CHECK(at_path(v, "runtime.platform").is_string());
  CHECK(at_path(v, "runtime.rank_env.rank").as_int64() == 0);
  CHECK(at_path(v, "runtime.rank_env.world_size").as_int64() == 1);
  CHECK(at_path(v, "runtime.rank_env.local_rank").as_int64() == 0);
  CHECK(at_path(v, "runtime.rank_env.torchrun").is_bool());
  CHECK(at_path(v, "launch.torchrun").is_bool());
  CHECK(at_path(v, "summary.passed").as_bool());

  const json::Array& cases = at_path(v, "cases").as_array();
  REQUIRE(cases.size() == 2);
  for (const Value& c : cases) {
    const std::string name = at_path(c, "case_name").as_string();
    CAPTURE(name);
    for (const char* k : {"topology.tp_world_size",
                          "topology.cp_world_size",
                          "topology.tp_rank",
                          "topology.logical_cp_ranks",
                          "topology.local_num_query_heads",
                          "topology.local_num_kv_heads",
                          "topology.local_query_head_range",
                          "topology.local_kv_head_range",
                          "topology.head_dim",
                          "topology.q_sequence_bounds",
                          "topology.kv_block_bounds",
                          "topology.layout",
                          "topology.protocol",
                          "topology.transport",
                          "topology.physical_processes",
                          "topology.placement",
                          "provenance.backend",
                          "provenance.candidate_backend",
                          "provenance.dtype",
                          "provenance.split_kv_policy",
                          "provenance.requested_split_kv_size",
                          "provenance.actual_split_kv_plans",
                          "provenance.kv_chunk_size",
                          "provenance.deterministic_controls",
                          "provenance.rope.rope_theta",
                          "provenance.rope.rope_output_dtype",
                          "provenance.rope.query_position_offsets",
                          "drift.rope.q",
                          "drift.rope.k",
                          "drift.topology_invariance.reference_case",
                          "drift.topology_invariance.bitwise_equal",
                          "te_merge_oracle.te_module",
                          "backward.status",
                          "dlogp.status",
                          "distributed_p2p_reference.reason"}) {
      CAPTURE(k);
      at_path(c, k);
    }
    CHECK(at_path(c, "provenance.reference_backend").as_string() == "cp1_fp32_prefill");
    CHECK(at_path(c, "provenance.accum_dtype").as_string() == "fp32");
    CHECK(at_path(c, "provenance.downcast_at").as_string() == "final_write");
    CHECK(at_path(c, "provenance.lse_domain").as_string() == "attention");
    CHECK(at_path(c, "provenance.merge_order").as_string() == "global_block_index");
    CHECK(at_path(c, "provenance.scale_placement").as_string() == "scores_after_qk_matmul");
    CHECK(at_path(c, "provenance.dropout_policy").as_string() == "disabled");
    CHECK(at_path(c, "provenance.rope.rope_state").as_string() == "post_rope");
    CHECK(at_path(c, "provenance.rope.rope_cast_at").as_string() == "rope_output");
    CHECK(at_path(c, "provenance.actual_split_kv_plan_set.coverage").as_string() ==
          "complete_batch_tp_cp_owner_cartesian_product");
    CHECK(at_path(c, "provenance.actual_split_kv_plan_set.entries").size() == 1u * 2 * 2 * 2);
    for (const Value& plan : at_path(c, "provenance.actual_split_kv_plans").as_array()) {
      for (const char* k :
           {"owner_cp_rank", "requested_split_kv_policy", "requested_split_kv_size",
            "actual_split_kv_policy", "actual_split_kv_size", "actual_split_kv_count",
            "actual_split_boundaries", "split_kv_merge_order", "split_kv_accum_dtype",
            "split_kv_downcast_at", "split_kv_backend", "split_kv_plan_source", "split_kv_fallback",
            "split_kv_fallback_reason"}) {
        CAPTURE(k);
        at_path(plan, k);
      }
    }
    for (const char* d : {"drift.cp_merge_fp32", "drift.dtype_path_vs_fp32", "drift.bf16_kernel",
                          "drift.topology_invariance"}) {
      require_stats(at_path(c, (std::string(d) + ".out").c_str()), std::string(d) + ".out");
      require_stats(at_path(c, (std::string(d) + ".lse").c_str()), std::string(d) + ".lse");
    }
    CHECK(at_path(c, "drift.cp_merge_fp32.source_class").as_string() ==
          "reduction_and_collective_drift");
    CHECK(at_path(c, "drift.dtype_path_vs_fp32.source_class").as_string() ==
          "arithmetic_schedule_drift");
    CHECK(at_path(c, "merge_order_probe.arrival_order_policy").as_string() ==
          "ignored_then_sorted_by_global_block_index");
    // Statistics objects, as the reference writes them, whose max_abs must be exactly 0.
    require_stats(at_path(c, "merge_order_probe.out"), "merge_order_probe.out");
    require_stats(at_path(c, "merge_order_probe.lse"), "merge_order_probe.lse");
    CHECK(at_path(c, "merge_order_probe.out.max_abs").as_double() == 0.0);
    CHECK(at_path(c, "merge_order_probe.lse.max_abs").as_double() == 0.0);
    CHECK(at_path(c, "merge_order_probe.out.active_count").as_int64() > 0);
    // The reference's shapes: a count of the CP ranks that ran (their ids kept beside it), one
    // RoPE offset per sequence, the TE module te_p2p emulates.
    CHECK(at_path(c, "model").as_string() == "qwen3-8b");
    CHECK(at_path(c, "topology.logical_cp_ranks").as_int64() == 2);
    CHECK(at_path(c, "topology.logical_cp_rank_ids") == Value(json::Array{0, 1}));
    CHECK(at_path(c, "provenance.rope.query_position_offsets") == Value(json::Array{0}));
    CHECK(at_path(c, "provenance.rope.key_position_offsets") == Value(json::Array{0}));
    CHECK(at_path(c, "provenance.rope.rope_output_dtype").as_string() == "bfloat16");
    CHECK(at_path(c, "provenance.deterministic_controls.num_threads").is_integer());
    CHECK(at_path(c, "provenance.deterministic_controls.reference").as_string() ==
          "strict_fp32_math_inside_cp_attention");
    CHECK(at_path(c, "te_merge_oracle.te_module").as_string() ==
          "transformer_engine.pytorch.attention.dot_product_attention.context_parallel");
    CHECK(at_path(c, "distributed_p2p_reference.status").as_string() == "not_requested");
    CHECK(at_path(c, "te_merge_oracle.fallback").as_string() == "deterministic_cp_reference");
    const json::Array& per_rank = at_path(c, "per_rank").as_array();
    REQUIRE(per_rank.size() == 2);
    for (const Value& pr : per_rank) {
      for (const char* k : {"rank", "query_start", "query_end"}) {
        CAPTURE(k);
        at_path(pr, k);
      }
      require_stats(at_path(pr, "out"), "per_rank.out");
      require_stats(at_path(pr, "lse"), "per_rank.lse");
    }
  }
  // The contract's example hashes come out of the real grids: S=16 CP=2 prefill, split 4.
  CHECK(at_path(cases[0], "provenance.block_metadata_hash").as_string() == "c7b6a36e348bc195");
  CHECK(at_path(cases[1], "provenance.block_metadata_hash").as_string() == "bae9b987400665a4");
  CHECK(at_path(cases[0], "attention_mode").as_string() == "prefill");
  CHECK(at_path(cases[1], "attention_mode").as_string() == "chunked_prefill");
  CHECK(at_path(cases[1], "drift.topology_invariance.required").as_bool());
  CHECK(at_path(cases[1], "drift.topology_invariance.bitwise_equal").as_bool());
  CHECK_FALSE(at_path(cases[0], "drift.topology_invariance.required").as_bool());

  // The training and logprob legs, as the contract lays them out.
  for (const Value& c : cases) {
    CHECK(at_path(c, "backward.status").as_string() == "available");
    CHECK(at_path(c, "backward.report.reference_name").as_string() == "cp1_backward_reference");
    const Value& d = at_path(c, "backward.report.drifts").at(0);
    for (const char* k : {"dq", "dk", "dv", "out", "lse"}) require_stats(at_path(d, k), k);
    CHECK(at_path(d, "per_rank").size() == 2u);
    for (const char* k :
         {"attention_mode", "gradient_mode", "saved_forward_state", "merge_order", "accum_dtype",
          "downcast_at", "dtypes", "decode_backward", "actual_split_kv_plans"}) {
      CAPTURE(k);
      at_path(d, (std::string("provenance.") + k).c_str());
    }
    CHECK(at_path(d, "provenance.gradient_mode").as_string() == "training_backward");
    CHECK(at_path(d, "provenance.saved_forward_state") ==
          Value(json::Array{"out", "attention_lse"}));
    CHECK(at_path(d, "provenance.cp_world_size").as_int64() == 2);
    CHECK(at_path(d, "provenance.gradient_inputs") == Value(json::Array{"q", "k", "v"}));
    for (const char* k : {"q_dtype", "k_dtype", "v_dtype", "dout_dtype", "output_dtype"})
      CHECK(at_path(d, (std::string("provenance.") + k).c_str()).as_string() == "float32");
    CHECK(at_path(d, "provenance.te_backward_oracle").as_string() == "not_used");
    CHECK(at_path(d, "provenance.decode_backward").as_string() == "not_supported");
    CHECK(at_path(d, "provenance.actual_split_kv_plans").at(0).at("split_kv_backend").as_string() ==
          "cpdrift_cpu_deterministic_cp_backward");
    CHECK(at_path(c, "dlogp.status").as_string() == "available");
    CHECK(at_path(c, "dlogp.projection").as_string() == "synthetic_fp32_lm_head_projection");
    CHECK(at_path(c, "dlogp.reference_cast_dtype").as_string() == "bfloat16");
    CHECK(at_path(c, "dlogp.vocab_size").as_int64() == 17);
    // Active tokens: all but each sequence's first (B = 1, S = 16).
    CHECK(at_path(c, "dlogp.active_token_count").as_int64() == 15);
    require_stats(at_path(c, "dlogp.drift"), "dlogp.drift");
  }
  CHECK(at_path(at_path(cases[0], "backward.report.drifts").at(0), "candidate_name").as_string() ==
        "cp2_backward");
  CHECK(at_path(at_path(cases[1], "backward.report.drifts").at(0), "candidate_name").as_string() ==
        "cp2_chunked_backward");
  CHECK(at_path(v, "dlogp.status").as_string() == "requested");
}

TEST_CASE("checks fail closed") {
  RunReport r = small_run({CaseSpec{1, 2, 4, CpLayout::contiguous, Protocol::ag_rs}});
  CHECK(evaluate_checks(r).empty());

  RunReport broken = r;
  broken.cases[0].topology.out.mismatch_count = 3;  // a required invariance that broke
  std::vector<std::string> failed = evaluate_checks(broken);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].find("topology_invariance not bitwise equal") != std::string::npos);

  broken = r;
  broken.cases[0].cp_merge_fp32.out.max_abs = 3e-4;  // over the 2e-4 threshold
  failed = evaluate_checks(broken);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].find("cp_merge_fp32.out.max_abs = 0.0003 exceeds 0.0002") != std::string::npos);

  broken = r;
  broken.cases[0].bf16_kernel.lse.nonfinite_count = 1;  // a non-finite metric is a failure
  failed = evaluate_checks(broken);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].find("non-finite") != std::string::npos);
  const Value s = stats_json(broken.cases[0].bf16_kernel.lse);
  CHECK(s.at("max_abs").is_null());  // never written as a number
  broken.failed_checks = failed;
  CHECK(json::to_string(report_json(broken)).find("\"passed\": false") != std::string::npos);

  broken = r;
  broken.cases[0].merge_probe.lse.mismatch_count = 1;
  CHECK(evaluate_checks(broken).size() == 1);
  broken = r;
  broken.merge_oracle_self_test = "out[0] differs";
  CHECK(evaluate_checks(broken).size() == 1);
}

TEST_CASE("the second-backend check: the FP32 path run again elsewhere must give the same bits") {
  // On a GPU run ctx.cpu_rerun_inputs is the CPU backend's; here both are CPU InputStores, so the
  // leg's plumbing (run, compare, digest, verdict) is exercised without a device. Negative control:
  // a checker whose inputs differ (another seed) is caught and fails the run.
  LocalRun run;
  const Problem& p = run.p;
  RunContext& ctx = run.ctx;
  const CaseSpec spec{2, 2, 4, CpLayout::contiguous, Protocol::ring_kv};
  for (const bool same : {true, false}) {
    CAPTURE(same);
    Problem other = p;
    if (!same) other.seed += 1;
    InputStore checker(other, run.pool);
    ctx.cpu_rerun_inputs = &checker;
    RunReport r;
    r.problem = p;
    r.cases.push_back(testing::recorded_case(ctx, spec));
    const CaseResult& c = r.cases.front();
    REQUIRE(c.cuda_vs_cpu_fp32.has_value());
    CHECK_FALSE(c.cublas_unfused.has_value());  // the CPU backend has no cuBLAS path
    CHECK(c.cuda_vs_cpu_fp32->out.bitwise_equal() == same);
    CHECK(c.cuda_vs_cpu_fp32->lse.bitwise_equal() == same);
    CHECK((c.cuda_vs_cpu_fp32->out.digest == c.cp_merge_fp32.out.digest) == same);
    const Value v = case_json(r, c).at("cuda_vs_cpu_fp32");
    CHECK(v.at("status").as_string() == "available");
    CHECK(v.at("bitwise_equal").as_bool() == same);
    CHECK(evaluate_checks(r).empty() == same);
  }
}
