// Trainer vs rollout through the command line: the aligned pair (trainer TP=2 CP=2
// zigzag split 64, rollout TP=1 page 16 decode fixed 64) bitwise equal on 1, 2 and 4
// processes with the same figures, the other pairs' drift reported (the production lanes' too),
// and the table's block.
#include <doctest/doctest.h>

#include <string>

#include "cli_support.h"
#include "report/json.h"

using namespace cli_test;

#if defined(CPD_HAVE_MPI)
TEST_CASE(
    "trainer vs rollout under mpirun -np 1, 2, 4: the aligned pairs bitwise, the rest drift, "
    "the same figures on every job size") {
  const std::string args =
      "--seq-len 256 --batch 2 --tp-world-sizes 2 --cp-world-sizes 2 --cp-layouts zigzag "
      "--kv-chunk-sizes 64,32 --modes chunked_prefill,decode --page-size 16 "
      "--split-kv-policies fixed,disabled,auto --fixed-split-size 64 --vocab-size 256 "
      "--threads 1";
  check_across_job_sizes(args, "trainer_vs_rollout", [](const cpd::json::Value& report) {
    const cpd::json::Value& block = report.at("trainer_vs_rollout");
    CHECK(block.at("status").as_string() == "available");
    const cpd::json::Array& pairs = block.at("pairs").as_array();
    REQUIRE(pairs.size() == 24);  // 2 trainer cases x 4 merges x 3 rollout cases
    int bitwise = 0, lanes = 0;
    for (const cpd::json::Value& p : pairs) {
      const std::string trainer = p.at("trainer").as_string(),
                        rollout = p.at("rollout").as_string(),
                        merge = p.at("trainer_merge").as_string();
      CAPTURE(trainer);
      CAPTURE(rollout);
      CAPTURE(merge);
      const bool aligned_blocks = trainer.find("chunk64") != std::string::npos &&
                                  rollout.find("fixed64") != std::string::npos;
      CHECK(p.at("passed").as_bool());
      CHECK(p.at("tokens").as_double() == 32);  // 2 sequences x q_len 16
      if (merge != "canonical") {
        // A production stack's merge of the same states: never required, and at CP=2 its
        // bits differ even where the canonical pair is exact (what the grid saves).
        ++lanes;
        CHECK(!p.at("aligned").as_bool());
        if (rollout.find("auto") == std::string::npos) {
          CHECK(p.at("status").as_string() == "drift");
          CHECK(p.at("out").at("mismatch_count").as_double() > 0);
        }
        continue;
      }
      CHECK(p.at("aligned").as_bool() == aligned_blocks);
      if (aligned_blocks) {
        ++bitwise;
        CHECK(p.at("status").as_string() == "bitwise_equal");
        CHECK(p.at("logprob").at("bitwise_equal").as_bool());
        CHECK(p.at("rl_metrics").at("first_divergent_token").is_null());
      } else if (rollout.find("auto") != std::string::npos) {
        CHECK(p.at("status").as_string() == "diagnostic");
      } else {
        CHECK(p.at("status").as_string() == "drift");
        CHECK(p.at("out").at("mismatch_count").as_double() > 0);
        CHECK(p.at("rl_metrics").at("abs_delta").at("max").as_double() > 0);
      }
    }
    CHECK(lanes == 18);
    CHECK(bitwise == 1);
  });
  // The human table's block (on stdout without --json).
  const Result r = run_mpi(4, args);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("# trainer vs rollout:") != std::string::npos);
  CHECK(r.out.find("bitwise (aligned)") != std::string::npos);
  CHECK(r.out.find("drift (blocks differ)") != std::string::npos);
  CHECK(r.out.find("drift (the stack's merge)") != std::string::npos);
}
#endif

TEST_CASE("a run without both sides says the pairs are not applicable") {
  const Result r = run("--seq-len 32 --json --quiet");
  REQUIRE(r.status == 0);
  const cpd::json::Value report = cpd::json::parse(r.out);
  CHECK(report.at("trainer_vs_rollout").at("status").as_string() == "not_applicable");
  CHECK(report.at("summary").at("trainer_vs_rollout_pair_count").as_double() == 0);
}

#if defined(CPD_HAVE_MPI)
TEST_CASE("rollout TP 1, 2, 4 under mpirun -np 1, 3: other placements, the same bits and pairs") {
  // --rollout-tp-sizes: TP rank t owns KV heads [2t, 2t+2) at TP=4; on 3 processes TP=1
  // spreads the 8 KV heads 2/3/3, TP=2 puts rank 0's 4 heads on process 0 and rank 1's on
  // processes 1 and 2, TP=4 hosts ranks 0,1 on process 0: three placements. The paged kernels
  // and the logit fold work per head, so every (mode, split) case has one digest and one
  // logprob figure whatever the TP and the job size, and the aligned pair with the trainer is
  // bitwise at every rollout TP (the run fails otherwise).
  const std::string args =
      "--seq-len 128 --batch 2 --tp-world-sizes 2 --cp-world-sizes 2 --cp-layouts zigzag "
      "--kv-chunk-sizes 32 --modes chunked_prefill,decode --page-size 16 "
      "--split-kv-policies fixed --fixed-split-size 32 --rollout-tp-sizes 1,2,4 --vocab-size 17 "
      "--threads 1 --json --quiet";
  std::string first;
  for (const int np : {1, 3}) {
    CAPTURE(np);
    const Result r = run_mpi(np, args);
    CAPTURE(r.err);
    REQUIRE(r.status == 0);
    const cpd::json::Value report = cpd::json::parse(r.out);
    const cpd::json::Array& paged = report.at("paged_cases").as_array();
    REQUIRE(paged.size() == 3);
    std::string figures;
    for (std::size_t i = 0; i < paged.size(); ++i) {
      const cpd::json::Value& c = paged[i];
      const int tp = 1 << i;  // 1, 2, 4 in order
      CHECK(c.at("case_name").as_string() ==
            "qwen3_8b_tp" + std::to_string(tp) + "_decode_split_kv_fixed32_bf16");
      CHECK(c.at("paged").at("shape").at("tp_world_size").as_double() == tp);
      const cpd::json::Value& d = c.at("paged").at("drift");
      const std::string these = d.at("candidate").at("out").at("digest").as_string() + " " +
                                cpd::json::to_string(d.at("dlogp"), false);
      if (figures.empty()) figures = these;
      CHECK(these == figures);  // the rollout TP never changes a bit
    }
    const cpd::json::Array& pairs = report.at("trainer_vs_rollout").at("pairs").as_array();
    int aligned = 0;
    for (const cpd::json::Value& p : pairs) {
      if (p.at("trainer_merge").as_string() != "canonical") continue;
      CHECK(p.at("aligned").as_bool());
      CHECK(p.at("bitwise_equal").as_bool());
      ++aligned;
    }
    CHECK(aligned == 3);  // the trainer case against each rollout TP
    if (first.empty()) first = figures;
    CHECK(figures == first);
  }
  // A size that does not divide the heads is refused before anything runs.
  const Result bad = run("--modes decode --rollout-tp-sizes 3");
  CHECK(bad.status == 2);
  CHECK(bad.err.find(
            "--rollout-tp-sizes 3: TP=3 must divide both the 32 query heads and the 8 KV heads") !=
        std::string::npos);
}
#endif
