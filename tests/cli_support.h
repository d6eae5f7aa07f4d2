// The command-line tests' helpers: the built binary (CPDRIFT_BIN) run alone or under mpirun
// (MPIRUN), its status, stdout and stderr captured.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

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

#if defined(CPD_HAVE_MPI)
// Under mpirun with n processes (MPIRUN is set by meson test).
inline Result run_mpi(int n, const std::string& args, const std::string& env = "") {
  const char* mpirun = std::getenv("MPIRUN");
  REQUIRE_MESSAGE(mpirun != nullptr, "MPIRUN is not set (meson test sets it)");
  return run_command(env + " " + mpirun + " -np " + std::to_string(n) + " --oversubscribe " +
                     bin() + " " + args);
}
#endif

}  // namespace cli_test
