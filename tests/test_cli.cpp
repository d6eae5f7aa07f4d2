// The command line end to end: bad input exits 2 with one clear line before any work, and
// the smoke run prints a complete report. Runs the built binary (CPDRIFT_BIN).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cpdrift/report/json.h"

namespace {

struct Result {
  int status = -1;
  std::string out, err;
};

Result run(const std::string& args) {
  const char* bin = std::getenv("CPDRIFT_BIN");
  REQUIRE_MESSAGE(bin != nullptr, "CPDRIFT_BIN is not set (meson test sets it)");
  const std::string err_path = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                               "/cpdrift_cli_err_" + std::to_string(::getpid());
  const std::string cmd = std::string(bin) + " " + args + " 2>" + err_path;
  Result r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int raw = ::pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  if (FILE* f = std::fopen(err_path.c_str(), "r")) {
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) r.err.append(buf.data(), n);
    std::fclose(f);
  }
  std::remove(err_path.c_str());
  return r;
}

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
  expect_usage_error("--tp-world-sizes 16", "TP=16 must divide");
  expect_usage_error("--kv-chunk-sizes 0", "must be at least 1");
  expect_usage_error("--kv-chunk-sizes none,-4", "must be at least 1");
  expect_usage_error("--batch 0", "--batch: must be at least 1");
  expect_usage_error("--seq-len 0", "--seq-len: must be at least 1");
  expect_usage_error("--frobnicate", "unknown option '--frobnicate'");
  expect_usage_error("--tp-world-sizes 1,,2", "malformed list");
  expect_usage_error("--cp-world-sizes 2x", "expected an integer");
  expect_usage_error("--seq-len 4 --cp-world-sizes 8", "needs seq-len divisible by 8");
  expect_usage_error("--cp-layouts zigzag --seq-len 6 --cp-world-sizes 2", "divisible by 4");
  expect_usage_error("--model llama", "unknown model");
  expect_usage_error("--seq-len", "missing value");
  expect_usage_error("--device cuda", "built without CUDA");
  expect_usage_error("--cp-layouts spiral", "unknown layout");
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
    CHECK(c.at("merge_order_probe").at("out").as_double() == 0.0);
    CHECK(c.at("merge_order_probe").at("lse").as_double() == 0.0);
    CHECK(c.at("backward").at("status").as_string() == "not_requested");
    CHECK(c.at("distributed_p2p_reference").at("status").as_string() == "skipped");
  }
  CHECK(report.at("summary").at("passed").as_bool());
  // The table went to stderr and ends with the verdict.
  CHECK(r.err.find("# Drift check : OK") != std::string::npos);
}
