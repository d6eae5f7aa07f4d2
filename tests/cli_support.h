// The command-line tests' helpers: the built binary (CPDRIFT_BIN) run alone or under mpirun
// (MPIRUN), its status, stdout and stderr captured.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "report/json.h"

namespace cli_test {

struct Result {
  int status = -1;
  std::string out, err;
};

inline std::string bin() {
  const char* path = std::getenv("CPDRIFT_BIN");
  REQUIRE_MESSAGE(path != nullptr, "CPDRIFT_BIN is not set (meson test sets it)");
  return path;
}

// Whether this test (and so, under .ci/sanitize --all, the binary it runs) is built with
// AddressSanitizer: its shadow memory is reserved address space, which an address-space limit
// (ulimit -v) below the node's memory leaves no room for, and it runs the binary several times
// slower.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// Where the tests put their files: $TMPDIR, else /tmp.
inline std::string tmp_dir() { return std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp"; }

// Everything a stream holds until its end.
inline std::string read_all(FILE* f) {
  std::string text;
  std::array<char, 4096> buf{};
  for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), f)) > 0;)
    text.append(buf.data(), n);
  return text;
}

// A file's contents ("" when it cannot be opened).
inline std::string slurp(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  std::string text = read_all(f);
  std::fclose(f);
  return text;
}

// Runs `command` through the shell; stdout and stderr captured separately.
inline Result run_command(const std::string& command) {
  const std::string err_path = tmp_dir() + "/cpdrift_cli_err_" + std::to_string(::getpid());
  Result r;
  FILE* pipe = ::popen((command + " 2>" + err_path).c_str(), "r");
  REQUIRE(pipe != nullptr);
  r.out = read_all(pipe);
  const int raw = ::pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.err = slurp(err_path);
  std::remove(err_path.c_str());
  return r;
}

inline Result run(const std::string& args) { return run_command(bin() + " " + args); }

// The processes still running the built binary (CPDRIFT_BIN), by /proc/PID/exe; waits up to
// `grace_ms` for them to go (Open MPI's teardown of an aborted job's processes takes a moment,
// longer on a loaded machine); returns as soon as none is left.
inline std::vector<int> processes_left(int grace_ms = 10000) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path binary = fs::canonical(bin(), ec);
  std::vector<int> left;
  for (int waited = 0;; waited += 50) {
    left.clear();
    for (const auto& e : fs::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::error_code gone;
      if (fs::read_symlink(e.path() / "exe", gone) == binary) left.push_back(std::stoi(name));
    }
    if (left.empty() || waited >= grace_ms) return left;
    ::usleep(50 * 1000);
  }
}

#if defined(CPD_HAVE_MPI)
// Under mpirun with n processes (MPIRUN is set by meson test).
inline Result run_mpi(int n, const std::string& args, const std::string& env = "") {
  const char* mpirun = std::getenv("MPIRUN");
  REQUIRE_MESSAGE(mpirun != nullptr, "MPIRUN is not set (meson test sets it)");
  return run_command(env + " " + mpirun + " -np " + std::to_string(n) + " --oversubscribe " +
                     bin() + " " + args);
}

// Runs `args` (with --json --quiet) under mpirun -np 1, 2 and 4: each run must pass, `check`
// sees its report and returns the text of what it compares, which must be the same on every
// job size.
template <class Check>
void check_across_job_sizes(const std::string& args, Check&& check) {
  std::string first;
  for (const int np : {1, 2, 4}) {
    CAPTURE(np);
    const Result r = run_mpi(np, args + " --json --quiet");
    CAPTURE(r.err);
    REQUIRE(r.status == 0);
    const cpd::json::Value report = cpd::json::parse(r.out);
    const std::string figures = check(report);
    CHECK(report.at("summary").at("passed").as_bool());
    if (first.empty()) first = figures;
    CHECK(figures == first);  // bit for bit whatever the job size
  }
}

// The same, comparing the report's `block`.
template <class Check>
void check_across_job_sizes(const std::string& args, const std::string& block, Check&& check) {
  check_across_job_sizes(args, [&](const cpd::json::Value& report) {
    check(report);
    return cpd::json::to_string(report.at(block), false);
  });
}
#endif

}  // namespace cli_test
