// Under mpirun (2 and 4 processes): cpdrift accept's row evaluation on evidence executed in
// this job — the CPU and paged rows pass, and every kind of bad evidence fails closed.
#include <doctest/doctest.h>

#include <functional>
#include <limits>
#include <string>

#include "accept/acceptance.h"
#include "engine/paged/paged_case.h"
#include "engine/rollout_pairs.h"
#include "metrics/rollout_pair_metrics.h"
#include "mpi_support.h"
#include "recorded_run.h"
#include "report/run_report.h"
#include "run_env.h"

using namespace cpd;
using namespace cpd::testing;

namespace {

Problem evidence_problem() {
  Problem p;
  p.seq_len = 16;
  p.batch = 2;
  return p;
}

RunReport empty_report(const RunEnv& env) {
  RunReport r;
  r.problem = env.problem;
  r.vocab_size = 17;
  r.provenance.world_size = comm().size();
  r.provenance.transport = env.transport->name();
  return r;
}

// The accept command's evidence, run here: TP=2 CP=2 BF16, full and chunked prefill (split 4
// under every protocol, split 8 for the trainer-vs-rollout pair), backward and dlogp.
json::Value evidence_report() {
  RunEnv env(evidence_problem(), true);
  RunContext ctx = env.ctx;
  DecodedCapture capture;
  capture.workload = make_paged_workload(env.problem, kAcceptPageSize, std::nullopt);
  capture.vocab_size = 17;
  ctx.decoded = &capture;
  RunReport r = empty_report(env);
  for (const std::optional<std::int64_t> split :
       {std::optional<std::int64_t>{}, std::optional<std::int64_t>{4}}) {
    for (Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv}) {
      r.cases.push_back(recorded_case(ctx, CaseSpec{2, 2, split, CpLayout::contiguous, protocol}));
    }
  }
  r.cases.push_back(
      recorded_case(ctx, CaseSpec{2, 2, kAcceptFixedSplit, CpLayout::contiguous, Protocol::ag_rs}));
  std::vector<PagedCaseSpec> paged;
  for (const SplitKv split :
       {SplitKv{SplitPolicy::disabled, 0}, SplitKv{SplitPolicy::fixed, kAcceptFixedSplit}}) {
    for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode})
      paged.push_back(PagedCaseSpec{m, split});
  }
  r.paged_cases = recorded_paged_cases(ctx, PagedOptions{kAcceptPageSize, std::nullopt, 17}, paged);
  if (comm().rank() == 0) r.rollout_pairs = compare_rollout_pairs(capture);
  return report_json(r);
}

json::Value& case_named(json::Value& report, const std::string& name) {
  for (json::Value& c : report.at("cases").as_array()) {
    if (c.at("case_name").as_string() == name) return c;
  }
  FAIL("no case " << name);
  return report;
}

// The row fails on the doctored report, and one of its errors says `expect`.
void expect_failure(const AcceptanceRow& row, const json::Value& report, int world,
                    const char* expect) {
  const RowVerdict v = evaluate_row(row, report, Thresholds{}, world, "report.json");
  CAPTURE(std::string(expect));
  CHECK(v.status == "failed");
  bool named = false;
  for (const std::string& e : v.errors) named = named || e.find(expect) != std::string::npos;
  CHECK(named);
}

AcceptanceRow row_named(const std::string& name) {
  for (const AcceptanceRow& r : required_matrix(ModelDims{})) {
    if (r.name == name) return r;
  }
  FAIL("no row " << name);
  return {};
}

const char* const kCpuRows[] = {"qwen3_8b_tp2_cp2_prefill_bf16", "qwen3_8b_tp2_cp2_chunk4_bf16",
                                "cp_protocol_equivalence_tp2_cp2_chunk4"};

}  // namespace

TEST_CASE("acceptance: the paged rows pass at any job size, bad paged evidence fails closed") {
  const json::Value report = evidence_report();
  if (comm().rank() != 0) return;
  const Thresholds t;
  const int world = comm().size();
  // With fewer processes than logical ranks the CPU rows are unavailable, never passed.
  for (const char* name : kCpuRows) {
    const RowVerdict v = evaluate_row(row_named(name), report, t, world, "report.json");
    CAPTURE(name);
    CHECK(v.status == (world >= 4 ? "passed" : "unavailable"));
  }
  // The paged rows run at any job size.
  const char* paged_rows[] = {"paged_prefill_split_kv_disabled", "paged_prefill_split_kv_fixed",
                              "paged_decode_split_kv_disabled",  "paged_decode_split_kv_fixed",
                              "batch_invariance_paged",          "page_layout_invariance"};
  for (const char* name : paged_rows) {
    const RowVerdict v = evaluate_row(row_named(name), report, t, world, "report.json");
    CAPTURE(name);
    CAPTURE(v.errors.empty() ? std::string() : v.errors.front());
    CHECK(v.status == "passed");
  }
  struct PagedFault {
    const char* row;
    const char* expect;
    std::function<void(json::Value&)> apply;
  };
  const std::string fixed_decode = "qwen3_8b_tp1_decode_split_kv_fixed8_bf16";
  const std::vector<PagedFault> paged_faults = {
      {"paged_decode_split_kv_fixed", "passed is not true",
       [](json::Value& c) { c["paged"]["invariance"]["prefix_cache"]["passed"] = false; }},
      {"paged_decode_split_kv_fixed", "exceeds",
       [](json::Value& c) { c["paged"]["drift"]["candidate"]["lse"]["max_abs"] = 3e-3; }},
      {"paged_decode_split_kv_fixed", "exceeds",
       [](json::Value& c) {
         c["paged"]["invariance"]["decode_vs_prefill"]["out"]["max_abs"] = 1e-9;
       }},
      {"paged_decode_split_kv_fixed", "not run as requested",
       [](json::Value& c) { c["paged"]["split_kv"]["plans"].at(1)["actual_split_size"] = 4; }},
      {"paged_decode_split_kv_fixed", "do not cover",
       [](json::Value& c) { c["paged"]["split_kv"]["coverage_complete"] = false; }},
      {"paged_decode_split_kv_fixed", "fewer than 2 sequences",
       [](json::Value& c) { c["paged"]["shape"]["batch"] = 1; }},
      {"paged_decode_split_kv_fixed", "never cut",
       [](json::Value& c) {
         for (json::Value& plan : c["paged"]["split_kv"]["plans"].as_array()) {
           plan["blocks"] = json::parse("[[0, 1]]");
         }
       }},
      {"batch_invariance_paged", "applicable is not true",
       [](json::Value& c) { c["paged"]["invariance"]["batch_composition"]["applicable"] = false; }},
      {"page_layout_invariance", "missing invariance",
       [](json::Value& c) { c["paged"]["invariance"].as_object().erase("page_layout"); }},
  };
  for (const PagedFault& f : paged_faults) {
    json::Value bad = report;
    for (json::Value& c : bad.at("paged_cases").as_array()) {
      if (c.at("case_name").as_string() == fixed_decode) f.apply(c);
    }
    CAPTURE(std::string(f.row));
    expect_failure(row_named(f.row), bad, world, f.expect);
  }
  json::Value no_paged = report;
  no_paged["paged_cases"] = json::Value::array();
  CHECK(evaluate_row(row_named("page_layout_invariance"), no_paged, t, world, "r").status ==
        "not_run");
}

// The CPU rows need a process per logical rank: meson runs this suite with 4 processes only.
TEST_SUITE("np4") {
  TEST_CASE("acceptance: executed CPU rows pass, and every kind of bad evidence fails closed") {
    REQUIRE_MESSAGE(comm().size() >= 4, "run with mpirun -np 4 (the CPU rows' TP=2 x CP=2)");
    const json::Value report = evidence_report();
    if (comm().rank() != 0) return;
    const Thresholds t;
    const int world = comm().size();
    const std::string chunked = "qwen3_8b_tp2_cp2_chunk4_bf16";
    for (const char* name : kCpuRows) {
      const RowVerdict v = evaluate_row(row_named(name), report, t, world, "report.json");
      CAPTURE(name);
      CAPTURE(v.errors.empty() ? std::string() : v.errors.front());
      CHECK(v.status == "passed");
    }
    struct Fault {
      const char* expect;
      std::function<void(json::Value&)> apply;
    };
    const std::vector<Fault> faults = {
        {"missing metric",
         [](json::Value& c) { c["drift"]["cp_merge_fp32"]["out"].as_object().erase("max_abs"); }},
        {"non-finite",
         [](json::Value& c) {
           c["backward"]["report"]["drifts"].at(0)["dk"]["max_abs"] = nullptr;
         }},
        {"negative metric", [](json::Value& c) { c["dlogp"]["drift"]["max_abs"] = -1.0; }},
        // In memory a metric can be NaN or infinite (no comparison with the limit catches NaN).
        {"non-finite metric",
         [](json::Value& c) {
           c["dlogp"]["drift"]["max_abs"] = std::numeric_limits<double>::quiet_NaN();
         }},
        {"non-finite metric",
         [](json::Value& c) {
           c["drift"]["cp_merge_fp32"]["out"]["max_abs"] = std::numeric_limits<double>::infinity();
         }},
        {"exceeds", [](json::Value& c) { c["drift"]["cp_merge_fp32"]["lse"]["max_abs"] = 3e-4; }},
        {"not run as requested",
         [](json::Value& c) {
           c["provenance"]["actual_split_kv_plans"].at(1)["actual_split_kv_size"] = 8;
         }},
        // TP rank 1's executed plan, not only rank 0's, must be the requested one.
        {"not run as requested",
         [](json::Value& c) {
           json::Value& entries = c["provenance"]["actual_split_kv_plan_set"]["entries"];
           entries.at(entries.size() - 1)["split_kv_fallback"] = true;
         }},
        {"incomplete plan-set coverage",
         [](json::Value& c) {
           c["provenance"]["actual_split_kv_plan_set"]["entries"].as_array().pop_back();
         }},
        {"emulated transport",
         [](json::Value& c) { c["distributed_p2p_reference"]["status"] = "skipped"; }},
        {"emulated transport",
         [](json::Value& c) { c["distributed_p2p_reference"]["transport"] = "inprocess"; }},
        {"bitwise",
         [](json::Value& c) { c["drift"]["topology_invariance"]["bitwise_equal"] = false; }},
    };
    for (const Fault& f : faults) {
      json::Value bad = report;
      f.apply(case_named(bad, chunked));
      expect_failure(row_named(chunked), bad, world, f.expect);
    }
    // A protocol that disagrees breaks the equivalence row.
    json::Value bad = report;
    case_named(bad, chunked + "_ring_kv")["drift"]["cp_merge_fp32"]["out"]["digest"] = "0000";
    CHECK(evaluate_row(row_named("cp_protocol_equivalence_tp2_cp2_chunk4"), bad, t, world, "r")
              .status == "failed");
    // The aligned trainer-vs-rollout pair passes; differing bits, an unaligned pair or a pair
    // that is not in the report fail it.
    const AcceptanceRow pair_row =
        row_named("trainer_vs_rollout_aligned_tp2_cp2_chunk8_vs_decode_fixed8");
    {
      const RowVerdict v = evaluate_row(pair_row, report, t, world, "r");
      CAPTURE(v.errors.empty() ? std::string() : v.errors.front());
      CHECK(v.status == "passed");
    }
    const auto doctor_pair = [&](const std::function<void(json::Value&)>& apply) {
      json::Value doctored = report;
      for (json::Value& p : doctored["trainer_vs_rollout"]["pairs"].as_array()) {
        if (p.at("trainer").as_string() == pair_row.cases[0] &&
            p.at("rollout").as_string() == pair_row.cases[1])
          apply(p);
      }
      return doctored;
    };
    expect_failure(pair_row,
                   doctor_pair([](json::Value& p) { p["logprob"]["mismatch_count"] = 1; }), world,
                   "logprob.mismatch_count is not 0");
    expect_failure(pair_row, doctor_pair([](json::Value& p) { p["aligned"] = false; }), world,
                   "aligned is not true");
    expect_failure(pair_row, doctor_pair([](json::Value& p) { p["rollout"] = "elsewhere"; }), world,
                   "is not in the report");
    // A case that never ran, and rows cpdrift cannot execute yet, fail closed too.
    json::Value empty = report;
    empty["cases"] = json::Value::array();
    CHECK(evaluate_row(row_named(chunked), empty, t, world, "r").status == "not_run");
    CHECK(evaluate_row(row_named("p2p_nccl_reference_np2"), report, t, world, "r").status ==
          "unavailable");
    std::vector<RowVerdict> all;
    for (const AcceptanceRow& r : required_matrix(ModelDims{}))
      all.push_back(evaluate_row(r, report, t, world, "r"));
    const json::Value doc = acceptance_json("run", all, t, json::Value::object(), "now");
    CHECK_FALSE(doc.at("passed").as_bool());  // the GPU transport rows are required and unavailable
    CHECK(doc.at("failed_required_cases").size() == all.size() - 10);
  }

  TEST_CASE("acceptance: a case whose executed grid is not the requested one fails its row") {
    REQUIRE_MESSAGE(comm().size() >= 4, "run with mpirun -np 4 (the CPU rows' TP=2 x CP=2)");
    // The real path, no edited JSON: the engine runs the grid of split 2 while the case says it
    // was asked for split 4; the record reads the blocks the states carried.
    RunEnv env(evidence_problem(), true);
    RunReport r = empty_report(env);
    const CaseSpec requested{2, 2, 4, CpLayout::contiguous, Protocol::ag_rs};
    const CaseSpec executed{2, 2, 2, CpLayout::contiguous, Protocol::ag_rs};
    RunRecorder recorder(r, env.ctx.collectives, env.ctx.pool, false, nullptr);
    run_schedule(env.ctx, requested,
                 schedule_case(CaseGrid(env.problem, executed), schedule_options(env.ctx)),
                 recorder);
    run_case(env.ctx, requested, recorder);  // the control: run as requested
    if (comm().rank() != 0) return;
    json::Value report = report_json(r);
    const std::string name = case_name(requested, Problem{});
    json::Value& cases = report["cases"];
    const json::Value as_run = cases.at(0), as_requested = cases.at(1);
    const AcceptanceRow row = row_named(name);
    for (const json::Value* c : {&as_run, &as_requested}) {
      cases = json::Value::array();
      cases.push_back(*c);
      const bool honest = c == &as_requested;
      const RowVerdict v = evaluate_row(row, report, Thresholds{}, comm().size(), "r");
      CAPTURE(honest);
      CAPTURE(v.errors.empty() ? std::string() : v.errors.front());
      if (honest) {
        CHECK(v.status == "passed");
      } else {
        expect_failure(row, report, comm().size(), "not run as requested");
        const json::Value& plan = c->at("provenance").at("actual_split_kv_plans").at(0);
        CHECK(plan.at("actual_split_kv_size").as_int64() == 2);
        CHECK(plan.at("split_kv_fallback").as_bool());
      }
    }
  }
}  // TEST_SUITE("np4")
