// The command line end to end: bad input exits 2 with one clear line before any work, and
// the smoke run prints a complete report. Runs the built binary (CPDRIFT_BIN).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cli_support.h"
#include "comm/gpu_transports.h"
#include "kernels/attention_backend.h"
#include "report/json.h"

using namespace cli_test;

namespace {

void expect_usage_error(const std::string& args, const std::string& fragment) {
  CAPTURE(args);
  const Result r = run(args);
  CHECK(r.status == 2);
  CHECK(r.out.empty());  // nothing ran, nothing printed on stdout
  CHECK(r.err.rfind("cpdrift: error: ", 0) == 0);
  CHECK(r.err.find(fragment) != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);  // one line
}

}  // namespace

TEST_CASE("bad input exits 2 with one line naming the problem") {
  expect_usage_error("--tp-world-sizes 3", "TP=3 must divide");
  expect_usage_error("--tp-world-sizes 16", "TP=16 exceeds the 8 KV heads");
  expect_usage_error("--kv-chunk-sizes 0", "must be at least 1");
  expect_usage_error("--kv-chunk-sizes none,-4", "must be at least 1");
  expect_usage_error("--batch 0", "--batch: must be from 1 to 4096");
  expect_usage_error("--seq-len 0", "--seq-len: must be from 1 to 1073741824");
  expect_usage_error("--frobnicate", "unknown option '--frobnicate'");
  expect_usage_error("--tp-world-sizes 1,,2", "malformed list");
  expect_usage_error("--cp-world-sizes 2x", "expected an integer");
  expect_usage_error("--seq-len 4 --cp-world-sizes 8", "needs seq-len divisible by 8");
  expect_usage_error("--cp-layouts zigzag --seq-len 6 --cp-world-sizes 2", "divisible by 4");
  expect_usage_error("--model llama", "unknown model");
  expect_usage_error("--seq-len", "missing value");
  expect_usage_error("--comm-timeout 0", "--comm-timeout: must be from 1 to 604800 (seconds");
  expect_usage_error("--transport ucx", "unknown transport 'ucx'");
  // The GPU transports and --device cuda without a device: errors whose words depend on the build.
  if (!cpd::cuda_backend_built()) {
    expect_usage_error("--transport nccl", "built without CUDA");
    expect_usage_error("--transport cuda_ipc", "built without CUDA");
  } else if (!cpd::nccl_transport_built()) {
    expect_usage_error("--transport nccl", "built without NCCL");
  } else if (cpd::cuda_device_count() == 0) {
    expect_usage_error("--transport nccl", "needs the CUDA backend");
  }
  if (!cpd::cuda_backend_built()) {
    expect_usage_error("--device cuda", "built without CUDA");
  } else if (cpd::cuda_device_count() == 0) {
    expect_usage_error("--device cuda", "no CUDA device");
  }
  expect_usage_error("--cp-layouts spiral", "unknown layout");
  expect_usage_error("--kv-chunk-sizes none,full", "'full' repeats 'none'");
  // A split that cuts nothing is 'none' under another name (and the largest int64 is one).
  expect_usage_error("--seq-len 8 --kv-chunk-sizes 8", "cuts nothing: that is 'none'");
  expect_usage_error("--kv-chunk-sizes 9223372036854775807", "not shorter than the sequence");
  expect_usage_error("--cp-world-sizes 2,2", "--cp-world-sizes: '2' repeats");
  expect_usage_error("--output /nonexistent-dir/r.json", "--output: cannot write");
  expect_usage_error("--modes sideways", "unknown mode 'sideways'");
  expect_usage_error("--page-size 4", "applies to the paged modes");
  expect_usage_error("--modes decode --seq-len 32 --page-size 4 --fixed-split-size 6",
                     "must be a multiple of --page-size 4");
  expect_usage_error("--modes decode --seq-len 32 --q-len 40", "room for 1 to");
  expect_usage_error("--modes decode --split-kv-policies fixed,fixed",
                     "--split-kv-policies: 'fixed' repeats");
  expect_usage_error("--modes decode --split-kv-policies sometimes", "unknown split-KV policy");
  expect_usage_error("--modes decode --seq-len 16 --batch 16 --page-size 4",
                     "too short for --batch 16");
  expect_usage_error("--modes decode --seq-len 32 --page-size 1073741824",
                     "larger than --seq-len 32");
  expect_usage_error("--modes chunked_prefill --kv-chunk-sizes none", "lists no split size");
  expect_usage_error("--modes decode --split-kv-policies disabled --fixed-split-size 8",
                     "needs the fixed policy");
}

TEST_CASE("issue 49's two numbers: refused with one line at once, nothing written") {
  // --threads 100000 used to hang the run, and compare --tis-clip 0 was accepted.
  const std::string dir = tmp_dir() + "/cpdrift_ranges_" + std::to_string(::getpid());
  run_command("rm -rf " + dir + "; mkdir -p " + dir +
              "; echo '{\"sequence\": 0, \"position\": 1, \"token_id\": 5, \"logprob\": -0.5}' > " +
              dir + "/a.jsonl");
  const auto started = std::chrono::steady_clock::now();
  expect_usage_error("--threads 100000 --output " + dir + "/r.json --dump " + dir + "/d.h5",
                     "cpdrift: error: --threads: must be from 1 to ");
  expect_usage_error(
      "compare " + dir + "/a.jsonl " + dir + "/a.jsonl --tis-clip 0 --output " + dir + "/c.json",
      "--tis-clip: must be at least 1 (ratios above it are clipped");
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(60));
  CHECK(run_command("ls " + dir).out == "a.jsonl\n");  // no report, no dump, no partial
  // Negative controls: inside their ranges both run, and write what they were asked to.
  CHECK(run("--smoke --quiet --threads 1 --output " + dir + "/r.json").status == 0);
  CHECK(run("compare " + dir + "/a.jsonl " + dir + "/a.jsonl --quiet --tis-clip 1 --output " + dir +
            "/c.json")
            .status == 0);
  CHECK(run_command("ls " + dir).out == "a.jsonl\nc.json\nr.json\n");
  run_command("rm -rf " + dir);
}

TEST_CASE("a split larger than any owner range is one block per range") {
  const Result r = run("--seq-len 8 --cp-world-sizes 2 --kv-chunk-sizes 6 --json --quiet");
  REQUIRE(r.status == 0);
  const cpd::json::Value report = cpd::json::parse(r.out);
  CHECK(cpd::json::to_string(report.at("cases").at(0).at("topology").at("kv_block_bounds"),
                             false) == "[[0,4],[4,8]]");
}

TEST_CASE("paged modes alone: a report of paged cases, every invariance passed, no CP cases") {
  const Result r =
      run("--modes paged_prefill,decode --page-size 4 --fixed-split-size 8 --seq-len 32 --batch 3 "
          "--split-kv-policies disabled,fixed,auto --json --threads 1");
  REQUIRE(r.status == 0);
  CHECK(r.err.find("paged (rollout side, TP=1)") != std::string::npos);  // the table on stderr
  const cpd::json::Value report = cpd::json::parse(r.out);
  CHECK(report.at("cases").as_array().empty());
  const cpd::json::Array& paged = report.at("paged_cases").as_array();
  REQUIRE(paged.size() == 6);
  CHECK(paged[3].at("case_name").as_string() == "qwen3_8b_tp1_decode_split_kv_fixed8_bf16");
  CHECK(paged[3].at("attention_mode").as_string() == "decode");
  CHECK(paged[3].at("paged").at("split_kv").at("coverage_complete").as_bool());
  for (std::size_t i = 0; i < 4; ++i) {
    for (const auto& [name, inv] : paged[i].at("paged").at("invariance").as_object()) {
      CAPTURE(name);
      CHECK(inv.at("passed").as_bool());
    }
  }
  CHECK_FALSE(paged[5].at("paged").at("invariance").at("decode_vs_prefill").at("passed").as_bool());
  CHECK(report.at("thresholds").at("paged_lse_max_abs").as_double() == 2.0e-3);
  CHECK(report.at("summary").at("passed").as_bool());
}

TEST_CASE("bench prints a figure for every CPU path, and paged reads keep the bits") {
  // Figures only (no timing is asserted): every path ran, and the paged forward's bits equal
  // the contiguous one's.
  const Result r = run("bench --seq-len 64 --repeats 1 --threads 1");
  CHECK(r.status == 0);
  for (const char* path :
       {"fp32_reference ", "bf16_kernel_emulated ", "fp32_reference_paged16 ", "fp32_backward "}) {
    CAPTURE(path);
    CHECK(r.out.find(path) != std::string::npos);
  }
  CHECK(r.out.find("bits == contiguous") != std::string::npos);
  // The whole case, run twice: the first in the process and again with the heap warm.
  CHECK(r.out.find("# whole case qwen3_8b_tp2_cp2_chunk16_bf16 ") != std::string::npos);
  for (const char* row : {"first (s)", "again (s)", "whole case ", "case / kernel passes "}) {
    CAPTURE(row);
    CHECK(r.out.find(row) != std::string::npos);
  }
}

TEST_CASE("a run too large for the memory is refused before it allocates, with what fits") {
  // 2^30 tokens: refused at once from the memo's floor, no grid built.
  Result r = run("--seq-len 1073741824 --quiet");
  CHECK(r.status == 2);
  CHECK(r.err.find("not enough memory") != std::string::npos);
  CHECK(r.err.find("terminate") == std::string::npos);
  if (kAddressSanitizer) {
    MESSAGE("the ulimit -v part is left to the build without AddressSanitizer");
    return;
  }
  // 8 GB of address space for S=65536, which needs about 19 GB on one process: the plan's
  // estimate says so up front (status 2), instead of an out-of-memory error mid-run. Not less:
  // on the H200's image, MPI_Init's hwloc loads an OpenCL driver (PoCL) whose thread pool
  // aborts the process under 2 GB, before cpdrift runs a line of its own (docs/device.md).
  r = run_command("ulimit -v 8000000; " + bin() + " --seq-len 65536 --quiet");
  CAPTURE(r.err);
  CHECK(r.status == 2);
  CHECK(r.err.find("cpdrift: error: not enough memory: process 0 would need about ") !=
        std::string::npos);
  CHECK(r.err.find("the address-space limit (ulimit -v) 8.2 GB") != std::string::npos);
  // Negative control: the same address-space limit lets a small run through.
  r = run_command("ulimit -v 8000000; " + bin() + " --seq-len 256 --quiet");
  CAPTURE(r.err);
  CHECK(r.status == 0);
}

TEST_CASE("the table shows the RL metrics block when dlogp ran, and only then") {
  const std::string args = "--seq-len 64 --tp-world-sizes 1 --cp-world-sizes 2 --kv-chunk-sizes 16";
  const Result with = run(args + " --include-dlogp");
  REQUIRE(with.status == 0);
  const std::size_t block = with.out.find("# each case's selected-token logprobs against its");
  REQUIRE(block != std::string::npos);
  const std::size_t row = with.out.find("\n  qwen3_8b_tp1_cp2_chunk16_bf16 ", block);
  REQUIRE(row != std::string::npos);
  CHECK(with.out.find("seq 0 pos", row) != std::string::npos);  // BF16 vs FP32 diverges at once
  const Result without = run(args);
  REQUIRE(without.status == 0);
  CHECK(without.out.find("selected-token logprobs") == std::string::npos);
}

TEST_CASE("output paths: a directory, one file for two outputs, an existing dump, a missing dir") {
  const std::string dir = tmp_dir() + "/cpdrift_outputs_" + std::to_string(::getpid());
  run_command("rm -rf " + dir + "; mkdir -p " + dir);
  const std::string small = "--seq-len 16 --quiet ";
  expect_usage_error(small + "--output " + dir, "--output " + dir + ": is a directory");
  expect_usage_error(small + "--output " + dir + "/", "is a directory");
  expect_usage_error(small + "--output " + dir + "/nowhere/r.json", "cannot write next to");
#if defined(CPD_HAVE_HDF5)
  {
    expect_usage_error(small + "--dump " + dir, "--dump " + dir + ": is a directory");
    expect_usage_error(small + "--output " + dir + "/x --dump " + dir + "/./x",
                       "--output and --dump name the same file");
    // An existing dump is kept unless --overwrite says to replace it.
    run_command("echo keep > " + dir + "/d.h5");
    expect_usage_error(small + "--dump " + dir + "/d.h5", "the file exists (--overwrite");
    CHECK(slurp(dir + "/d.h5") == "keep\n");
    CHECK(run(small + "--dump " + dir + "/d.h5 --overwrite").status == 0);
    CHECK(slurp(dir + "/d.h5") != "keep\n");
  }
#endif
  // accept creates no directory on the way to its file.
  expect_usage_error("accept --mode manifest --output " + dir + "/missing/acceptance.json",
                     "does not exist");
  CHECK(run_command("test -e " + dir + "/missing").status != 0);
  expect_usage_error("plan --overwrite", "--overwrite does not apply");
  run_command("rm -rf " + dir);
}

TEST_CASE("--help prints usage and exits 0") {
  const Result r = run("--help");
  CHECK(r.status == 0);
  CHECK(r.out.find("usage: cpdrift") != std::string::npos);
}

TEST_CASE("--smoke --json prints a complete report with 8 cases and a zero merge-order probe") {
  const Result r = run("--smoke --json --threads 1");
  REQUIRE(r.status == 0);
  const cpd::json::Value report = cpd::json::parse(r.out);
  CHECK(report.at("schema_version").as_string() == "ws2_cp_attention_drift/v2");
  const cpd::json::Array& cases = report.at("cases").as_array();
  REQUIRE(cases.size() == 8);
  const char* names[] = {"qwen3_8b_tp1_cp1_prefill_bf16", "qwen3_8b_tp1_cp1_chunk1_bf16",
                         "qwen3_8b_tp1_cp2_prefill_bf16", "qwen3_8b_tp1_cp2_chunk1_bf16",
                         "qwen3_8b_tp2_cp1_prefill_bf16", "qwen3_8b_tp2_cp1_chunk1_bf16",
                         "qwen3_8b_tp2_cp2_prefill_bf16", "qwen3_8b_tp2_cp2_chunk1_bf16"};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const cpd::json::Value& c = cases[i];
    CHECK(c.at("case_name").as_string() == names[i]);
    CHECK(c.at("merge_order_probe").at("out").at("max_abs").as_double() == 0.0);
    CHECK(c.at("merge_order_probe").at("lse").at("max_abs").as_double() == 0.0);
    CHECK(c.at("backward").at("status").as_string() == "not_requested");
    // One process: the reference's words for "no process group".
    CHECK(c.at("distributed_p2p_reference").at("status").as_string() == "not_requested");
  }
  CHECK(report.at("summary").at("passed").as_bool());
  // The table went to stderr and ends with the verdict.
  CHECK(r.err.find("# Drift check : OK") != std::string::npos);
}

TEST_CASE(
    "plan: every case's messages and bytes are what the run counts, on 1, 2 and 4 processes") {
  const std::string cases =
      "--seq-len 48 --tp-world-sizes 1,2 --cp-world-sizes 1,2,3 --kv-chunk-sizes none,5 "
      "--cp-layouts contiguous,zigzag --protocols ag_rs,ring_kv,allgather_kv --include-backward "
      "--include-dlogp --vocab-size 17";
  const Result planned = run("plan --profile cpu " + cases + " --json");
  REQUIRE(planned.status == 0);
  const cpd::json::Value plan_doc = cpd::json::parse(planned.out);
  const cpd::json::Array& plan = plan_doc.at("cases").as_array();
  for (const int np : {1, 2, 4}) {
    CAPTURE(np);
#if defined(CPD_HAVE_MPI)
    const std::string args = cases + " --threads 1 --json";
    const Result ran = np == 1 ? run(args) : run_mpi(np, args);
#else
    if (np > 1) continue;
    const Result ran = run(cases + " --threads 1 --json");
#endif
    REQUIRE(ran.status == 0);
    const cpd::json::Value report_doc = cpd::json::parse(ran.out);
    const cpd::json::Array& report = report_doc.at("cases").as_array();
    REQUIRE(report.size() == plan.size());
    REQUIRE(report.size() > 20);
    for (std::size_t i = 0; i < plan.size(); ++i) {
      CAPTURE(plan[i].at("name").as_string());
      CHECK(report[i].at("case_name").as_string() == plan[i].at("name").as_string());
      CHECK(report[i].at("execution").at("messages") == plan[i].at("messages"));
      CHECK(report[i].at("execution").at("bytes_moved") == plan[i].at("bytes_moved"));
    }
  }
}

TEST_CASE("plan: the table, the protocol pick and bad input") {
  const Result r =
      run("plan --seq-len 32768 --tp-world-sizes 2 --cp-world-sizes 2 "
          "--kv-chunk-sizes 512 --include-backward");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("# case qwen3_8b_tp2_cp2_chunk512_bf16: 4 ranks, 64 KV blocks") !=
        std::string::npos);
  CHECK(r.out.find("  protocol: ") != std::string::npos);
  CHECK(r.out.find("# estimated total: ") != std::string::npos);
  expect_usage_error("plan --profile tpu", "unknown profile 'tpu'");
  expect_usage_error("plan --profile cpu --fp32-tflops 10", "--profile cpu measures");
  expect_usage_error("plan --dump x.h5", "--dump does not apply");
  expect_usage_error("plan --nvlink-gbs 0", "--nvlink-gbs: must be from 0.001 to 1e+06");
  expect_usage_error("plan --processes 4", "--processes applies to --profile cpu");
  expect_usage_error("plan --progress", "--progress does not apply");
  expect_usage_error("plan --threads 2", "--threads does not apply");
  expect_usage_error("plan --transport mpi", "plan: --transport does not apply (a plan moves");
  // Given at all, even at its default, a flag of how a run executes is refused.
  expect_usage_error("plan --transport auto", "plan: --transport does not apply");
  expect_usage_error("plan --staging-mib 64", "plan: --staging-mib does not apply");
  expect_usage_error("plan --output /nonexistent-dir/plan.json", "--output: cannot write");
  expect_usage_error("plan --seq-len 1073741824 --tp-world-sizes 8 --cp-world-sizes 32",
                     "more (row, key) pairs than the plan counts");
}

#if defined(CPD_HAVE_MPI)
TEST_CASE("the RL metrics of every case are the same figures on 1, 2 and 4 processes") {
  // Gathered to rank 0 in (sequence, position) order and computed there, they cannot depend
  // on where the tokens lived. Negative control: another seed changes them.
  const std::string args =
      "--seq-len 48 --batch 2 --tp-world-sizes 1,2 --cp-world-sizes 2 --kv-chunk-sizes 8 "
      "--cp-layouts zigzag --include-dlogp --vocab-size 256 --json --quiet";
  std::vector<std::string> runs;
  for (const auto& [np, extra] : std::vector<std::pair<int, std::string>>{
           {1, ""}, {2, " --protocols ring_kv"}, {4, ""}, {4, " --seed 7"}}) {
    const Result r = run_mpi(np, args + extra);
    REQUIRE(r.status == 0);
    const cpd::json::Value report = cpd::json::parse(r.out);
    std::string all;
    for (const cpd::json::Value& c : report.at("cases").as_array()) {
      const cpd::json::Value& m = c.at("dlogp").at("rl_metrics");
      CHECK(m.at("tokens").as_uint64() == 2 * 47);  // every token but each sequence's first
      CHECK(m.at("worst_tokens").as_array().size() == 5);
      all += cpd::json::to_string(m);
    }
    runs.push_back(all);
  }
  CHECK(runs[1] == runs[0]);
  CHECK(runs[2] == runs[0]);
  CHECK(runs[3] != runs[0]);
}
#endif

#if defined(CPD_HAVE_MPI)
TEST_CASE(
    "accept --mode run under mpirun -np 4: CPU and paged rows pass, the rest fail closed, exit 1") {
  const std::string dir = tmp_dir() + "/cpdrift_accept_" + std::to_string(::getpid());
  run_command("mkdir -p " + dir);
  // A looser paged LSE gate than design §7's: the rows and the report they cite both use it.
  const Result r = run_mpi(4, "accept --mode run --threads 1 --paged-lse-threshold 0.25 --output " +
                                  dir + "/acceptance.json");
  CHECK(r.status == 1);
  CHECK(r.out.find("# Acceptance : FAILED") != std::string::npos);
  const cpd::json::Value doc = cpd::json::parse(slurp(dir + "/acceptance.json"));
  CHECK(doc.at("schema_version").as_string() == "ws2_attention_gpu_acceptance/v1");
  CHECK(doc.at("mode").as_string() == "run");
  CHECK(doc.at("status").as_string() == "failed");
  std::size_t passed = 0;
  for (const cpd::json::Value& c : doc.at("cases").as_array()) {
    if (c.at("passed").as_bool()) ++passed;
    CHECK((c.at("passed").as_bool() ||
           !c.at("errors").as_array().empty()));  // every failure says why
  }
  CHECK(passed == 3 + 6 + 1);  // the CPU rows, the paged rows, the aligned trainer-vs-rollout pair
  CHECK(doc.at("thresholds").at("paged_lse_max_abs").as_double() == 0.25);
  const cpd::json::Value report = cpd::json::parse(slurp(dir + "/report.json"));  // the evidence
  CHECK(report.at("thresholds").at("paged_lse_max_abs").as_double() == 0.25);
  run_command("rm -rf " + dir);
}
#endif

TEST_CASE("accept --mode manifest executes nothing and fails") {
  const std::string dir = tmp_dir() + "/cpdrift_manifest_" + std::to_string(::getpid());
  run_command("mkdir -p " + dir);
  const Result r = run("accept --mode manifest --output " + dir +
                       "/acceptance.json --out-threshold 1e-3 --paged-lse-threshold 0.25");
  CHECK(r.status == 1);
  CHECK(r.out.find("not_run      manifest mode executes nothing") != std::string::npos);
  // Every threshold of design §7 is a flag; the file records what the rows were held to.
  const cpd::json::Value written = cpd::json::parse(slurp(dir + "/acceptance.json"));
  const cpd::json::Value& th = written.at("thresholds");
  CHECK(th.at("out_max_abs").as_double() == 1e-3);
  CHECK(th.at("paged_lse_max_abs").as_double() == 0.25);
  CHECK(th.at("paged_out_max_abs").as_double() == 1e-2);  // the default where no flag is given
  run_command("rm -rf " + dir);
  const Result bad = run("accept --mode maybe --output x.json");
  CHECK(bad.status == 2);
  CHECK(bad.err.find("unknown mode") != std::string::npos);
}
