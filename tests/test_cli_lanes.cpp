// The production lanes through the command line (numerics.md §10): at CP=1 every lane is the
// canonical merge bit for bit; at CP 2 and 4 every lane's bits differ from it, and differ
// across CP, where the canonical grid's do not; TP never changes them; and the figures are the
// same on 1, 2 and 4 processes (the emulation is exact, not a sample of a schedule).
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "cli_support.h"
#include "report/json.h"

using namespace cli_test;
using cpd::json::Value;

#if defined(CPD_HAVE_MPI)
TEST_CASE("production lanes under mpirun -np 1, 2, 4: equal at CP=1, vary with CP, same figures") {
  const std::string args =
      "--seq-len 64 --tp-world-sizes 1,2 --cp-world-sizes 1,2,4 --kv-chunk-sizes 8 "
      "--cp-layouts contiguous,zigzag --threads 1";
  check_across_job_sizes(args, "production_lanes", [](const Value& report) {
    const Value& block = report.at("production_lanes");
    for (const char* lane : {"te_p2p", "ring_fp32", "nccl_rs"}) {
      CAPTURE(std::string(lane));
      const Value& l = block.at("lanes").at(lane);
      const cpd::json::Array& cases = l.at("cases").as_array();
      REQUIRE(cases.size() == 12);  // TP 1,2 x CP 1,2,4 x 2 layouts
      std::set<std::string> digests_tp1, digests_tp2;
      for (const Value& c : cases) {
        const std::string name = c.at("case_name").as_string();
        CAPTURE(name);
        const bool cp1 = c.at("cp").as_double() == 1;
        CHECK(c.at("bitwise_equal_canonical").as_bool() == cp1);
        CHECK((c.at("out_mismatches_vs_canonical").as_double() > 0) == !cp1);
        (c.at("tp").as_double() == 1 ? digests_tp1 : digests_tp2)
            .insert(c.at("out_digest").as_string());
      }
      CHECK(digests_tp1 == digests_tp2);  // the heads' split never changes a lane
      for (const Value& g : l.at("topology_variance").as_array()) {
        CAPTURE(g.at("layout_and_split").as_string());
        CHECK(g.at("cases").as_double() == 6);
        CHECK(g.at("canonical_distinct_out_digests").as_double() == 1);  // the grid's invariance
        CHECK(g.at("distinct_out_digests").as_double() == 3);            // CP 1, 2, 4 differ
      }
    }
    // The per-case block says the same.
    for (const Value& c : report.at("cases").as_array()) {
      const Value& lanes = c.at("drift").at("production_lanes");
      CHECK(lanes.at("te_p2p").at("vs_fp32_reference").at("out").at("active_count").as_double() >
            0);
    }
  });
  const Result r = run_mpi(2, args);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("# production stacks, emulated") != std::string::npos);
  CHECK(r.out.find("= canon") != std::string::npos);
}
#endif

#if defined(CPD_HAVE_MPI)
TEST_CASE("te_p2p backward lane under mpirun -np 1, 2, 4: canonical at CP=1, drifts with CP") {
  // --include-lane-backward: at CP=1 the lane's one ring step is the canonical gradients'
  // BF16 write (no bit differs); at CP 2 and 4 its BF16 steps and sums differ from it; every
  // case's lane block is the same text on 1, 2 and 4 processes.
  const std::string args =
      "--seq-len 64 --tp-world-sizes 2 --cp-world-sizes 1,2,4 --kv-chunk-sizes 8 "
      "--cp-layouts zigzag --include-backward --include-lane-backward --vocab-size 17 "
      "--threads 1";
  check_across_job_sizes(args, [](const Value& report) {
    std::string blocks;
    for (const Value& c : report.at("cases").as_array()) {
      const Value& drift = c.at("backward").at("report").at("drifts").as_array().at(0);
      const Value& lane = drift.at("production_lanes").at("te_p2p");
      CAPTURE(c.at("case_name").as_string());
      REQUIRE(lane.at("status").as_string() == "available");
      const bool cp1 = c.at("topology").at("cp_world_size").as_double() == 1;
      for (const char* g : {"dq", "dk", "dv"}) {
        const double mismatches =
            lane.at("vs_canonical_bf16").at(g).at("mismatch_count").as_double();
        CHECK((mismatches == 0) == cp1);
        CHECK(lane.at("vs_fp32_reference").at(g).at("active_count").as_double() > 0);
      }
      blocks += cpd::json::to_string(lane, false);
    }
    return blocks;
  });
  const Result table = run_mpi(2, args);
  REQUIRE(table.status == 0);
  CHECK(table.out.find("# te_p2p backward, emulated") != std::string::npos);
  // Without the flag the block says how to ask for it; without the backward it is refused.
  const Result plain = run("--seq-len 16 --include-backward --json --quiet");
  REQUIRE(plain.status == 0);
  CHECK(plain.out.find("run with --include-lane-backward") != std::string::npos);
  const Result refused = run("--seq-len 16 --include-lane-backward");
  CHECK(refused.status == 2);
  CHECK(refused.err.find("needs --include-backward") != std::string::npos);
}
#endif
