// The CLI under mpirun: bad input and a run too large end every process at once with one line,
// different arguments refuse to start, and the report says how the processes ran and their peak
// memory.
#include <doctest/doctest.h>

#include <string>

#include "cli_support.h"
#include "report/json.h"

using namespace cli_test;

#if defined(CPD_HAVE_MPI)
TEST_CASE("under mpirun: bad input ends every process with status 2 and one line from rank 0") {
  const Result r = run_mpi(2, "--tp-world-sizes 3");
  CHECK(r.status == 2);
  CHECK(r.err.find("cpdrift: error: qwen3_8b_tp3_cp1_prefill_bf16: TP=3 must divide") !=
        std::string::npos);
  const std::string line = "cpdrift: error:";
  std::size_t count = 0;
  for (std::size_t at = r.err.find(line); at != std::string::npos; at = r.err.find(line, at + 1))
    ++count;
  CHECK(count == 1);
}

TEST_CASE("under mpirun: a run too large for the node's memory ends every process at once") {
  const Result r = run_mpi(2, "--seq-len 1073741824 --tp-world-sizes 1 --cp-world-sizes 2");
  CHECK(r.status == 2);
  const std::string line = "cpdrift: error: not enough memory: process 0 would need about ";
  CHECK(r.err.find(line) != std::string::npos);
  CHECK(r.err.find(line, r.err.find(line) + 1) == std::string::npos);  // one line, rank 0's
  CHECK(r.err.find("MemAvailable") != std::string::npos);
}
#endif

#if defined(CPD_HAVE_MPI)
TEST_CASE("under mpirun: processes given different arguments refuse to start") {
  const char* mpirun = std::getenv("MPIRUN");
  REQUIRE(mpirun != nullptr);
  const Result r = run_command(std::string(mpirun) + " -np 1 " + bin() + " --seq-len 16 : -np 1 " +
                               bin() + " --seq-len 32");
  CHECK(r.status == 2);
  CHECK(r.err.find("started with different arguments") != std::string::npos);
}
#endif

#if defined(CPD_HAVE_MPI)
TEST_CASE("under mpirun: 4 processes, one logical rank each, report says so") {
  const Result r =
      run_mpi(4, "--tp-world-sizes 2 --cp-world-sizes 2 --kv-chunk-sizes 4 --json --threads 1");
  REQUIRE(r.status == 0);
  const cpd::json::Value report = cpd::json::parse(r.out);
  CHECK(report.at("launch").at("world_size").as_int64() == 4);
  const cpd::json::Value& c = report.at("cases").at(0);
  CHECK(c.at("topology").at("physical_processes").as_int64() == 4);
  const cpd::json::Array& placement = c.at("topology").at("placement").as_array();
  REQUIRE(placement.size() == 4);
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(placement[i].at("process").as_int64() == static_cast<std::int64_t>(i));
  CHECK(c.at("distributed_p2p_reference").at("status").as_string() == "available");
  CHECK(c.at("distributed_p2p_reference").at("world_size").as_int64() == 4);
}
#endif

#if defined(CPD_HAVE_MPI)
TEST_CASE("under mpirun: the report gives each process's peak resident memory") {
  // One case, two logical ranks per process: at S=2048 each process holds at least its ranks'
  // query rows and their merged output at once (2 ranks x 2 tensors x 16 heads x 1024 rows x
  // 128 floats = 33.5 MB) on top of what the S=64 run needs.
  const auto peaks = [](const Result& r) {
    REQUIRE(r.status == 0);
    const cpd::json::Value report = cpd::json::parse(r.out);
    std::vector<std::int64_t> bytes;
    for (const cpd::json::Value& v :
         report.at("summary").at("peak_rss_bytes_per_process").as_array())
      bytes.push_back(v.as_int64());
    REQUIRE(bytes.size() == 2);
    return bytes;
  };
  const std::string args = "--tp-world-sizes 2 --cp-world-sizes 2 --kv-chunk-sizes none --json";
  const std::vector<std::int64_t> small = peaks(run_mpi(2, args + " --seq-len 64"));
  const std::vector<std::int64_t> large = peaks(run_mpi(2, args + " --seq-len 2048"));
  for (std::size_t p = 0; p < 2; ++p) {
    CHECK(small[p] > 0);
    CHECK(large[p] - small[p] >= 2 * 2 * 16 * 1024 * 128 * 4);
    CHECK(large[p] < (std::int64_t{4} << 30));
  }
  const Result table = run_mpi(2, "--tp-world-sizes 2 --cp-world-sizes 2 --seq-len 64");
  REQUIRE(table.status == 0);
  CHECK(table.out.find("resident per process (2 processes)") != std::string::npos);
}
#endif
