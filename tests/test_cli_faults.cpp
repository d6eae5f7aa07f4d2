// Fault injection through the command line (--inject-fault, comm/fault_injection.h): every
// broken exchange ends the whole job within seconds, every process with the same status, one
// line from rank 0 naming the message and its ranks, and no report under its final name.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_support.h"

using namespace cli_test;

namespace {

const std::string kCase =
    "--seq-len 64 --tp-world-sizes 2 --cp-world-sizes 2 --kv-chunk-sizes 16 --threads 1";

// cpdrift's own error lines (mpirun adds its notice of a non-zero exit status after them).
std::size_t error_lines(const std::string& err) {
  std::size_t n = 0;
  for (std::size_t at = err.find("cpdrift: error:"); at != std::string::npos;
       at = err.find("cpdrift: error:", at + 1))
    ++n;
  return n;
}

#if defined(CPD_HAVE_MPI) && defined(CPD_HAVE_HDF5)
// Whether a line of err starts with prefix. A process that fails alone prints its line, then
// MPI_Abort makes Open MPI print its own notice: that comes to mpirun by another channel than
// the process's stderr, so it may come first (seen in a CI rehearsal).
bool has_line_starting(const std::string& err, const std::string& prefix) {
  return err.rfind(prefix, 0) == 0 || err.find("\n" + prefix) != std::string::npos;
}
#endif

}  // namespace

TEST_CASE(
    "--inject-fault: bad specifications are usage errors, and a fault that never fires fails") {
  for (const char* bad : {"drop", "drop-state", "drop-state@x", "drop-state@-1", "lost@0",
                          "drop-state@0:0", "drop-state@0:"}) {
    CAPTURE(bad);
    const Result r = run(kCase + " --inject-fault " + bad);
    CHECK(r.status == 2);
    CHECK(error_lines(r.err) == 1);
    CHECK(r.err.find("--inject-fault") != std::string::npos);
  }
  const Result beyond = run(kCase + " --inject-fault drop-state@1");
  CHECK(beyond.status == 2);
  CHECK(beyond.err.find("the job has 1 process") != std::string::npos);
  // Paged cases exchange no partial state: the fault cannot fire, and the run says so.
  const std::string out = tmp_dir() + "/cpdrift_fault_never.json";
  const Result never =
      run("--seq-len 64 --modes paged_prefill --inject-fault drop-state@0 "
          "--output " +
          out);
  CHECK(never.status == 2);
  CHECK(never.err.find("nothing was injected") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(out));
}

#if defined(CPD_HAVE_MPI)
TEST_CASE("--inject-fault under mpirun -np 2 and 4: each message fault ends the job, one line") {
  struct Fault {
    const char* kind;
    const char* says;  // the manifest check that catches it
  };
  for (const Fault& f : {Fault{"drop-state", "missing partial_state"},
                         Fault{"duplicate-state", "duplicated partial_state"},
                         Fault{"wrong-block-index", "partial_state of KV block"},
                         Fault{"short-message", "mis-shaped partial_state"}}) {
    for (const int np : {2, 4}) {
      CAPTURE(std::string(f.kind));
      CAPTURE(np);
      const std::string out = tmp_dir() + "/cpdrift_fault_" + f.kind + ".json";
      std::filesystem::remove(out);
      const auto started = std::chrono::steady_clock::now();
      const Result r = run_mpi(np, kCase + " --output " + out + " --inject-fault " + f.kind + "@" +
                                       std::to_string(np - 1) + ":2");
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      CAPTURE(r.err);
      CHECK(r.status == 3);
      CHECK(seconds < 30.0);
      CHECK(error_lines(r.err) == 1);  // one line, from rank 0
      CHECK(r.err.rfind("cpdrift: error: ", 0) == 0);
      CHECK(r.err.find(f.says) != std::string::npos);
      CHECK(r.err.find("from logical rank") != std::string::npos);  // names the ranks
      CHECK_FALSE(std::filesystem::exists(out));
      CHECK(processes_left().empty());
    }
  }
}

TEST_CASE("--inject-fault corrupt-lse: the NaN reaches the figures and the run fails its checks") {
  for (const int np : {2, 4}) {
    CAPTURE(np);
    const Result r = run_mpi(np, kCase + " --inject-fault corrupt-lse@0");
    CAPTURE(r.err);
    CHECK(r.status == 1);
    CHECK(r.out.find("# FAILED: ") != std::string::npos);
    CHECK(r.out.find("non-finite") != std::string::npos);
    CHECK(r.out.find("Drift check : FAILED") != std::string::npos);
    CHECK(processes_left().empty());
  }
}

TEST_CASE("--inject-fault rank-exit: a process that exits mid-exchange ends the job in seconds") {
  for (const int np : {2, 4}) {
    CAPTURE(np);
    const std::string out = tmp_dir() + "/cpdrift_fault_exit.json";
    std::filesystem::remove(out);
    const auto started = std::chrono::steady_clock::now();
    const Result r =
        run_mpi(np, "--seq-len 512 --quiet --output " + out + " --inject-fault rank-exit@1");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    CHECK(r.status != 0);
    // The bound covers the run up to the exchange too, which AddressSanitizer slows about
    // fourfold (the sanitized suite's --timeout-multiplier).
    const double bound = kAddressSanitizer ? 120.0 : 30.0;
    if (kAddressSanitizer) MESSAGE("ASan build: rank-exit's bound is 120 s, not 30 s");
    CHECK(seconds < bound);
    CHECK(r.out.find("Drift check : OK") == std::string::npos);
    CHECK_FALSE(std::filesystem::exists(out));
    CHECK(processes_left().empty());
  }
}

TEST_CASE("--inject-fault slow-rank: a wait past --comm-timeout ends the job, rank 0 says so") {
  for (const int np : {2, 4}) {
    CAPTURE(np);
    const std::string out = tmp_dir() + "/cpdrift_fault_slow.json";
    std::filesystem::remove(out);
    const auto started = std::chrono::steady_clock::now();
    const Result r = run_mpi(np, kCase + " --comm-timeout 2 --output " + out +
                                     " --inject-fault slow-rank@" + std::to_string(np - 1));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    CAPTURE(r.err);
    CHECK(r.status != 0);
    CHECK(seconds < 20.0);  // the slow process alone would sleep 11 s more
    const std::string line =
        "cpdrift: error: rank 0: waited more than 2 s for another process (--comm-timeout)";
    CHECK(r.err.find(line) != std::string::npos);
    CHECK(r.err.find("cpdrift: error:", r.err.find(line) + 1) == std::string::npos);  // once
    CHECK_FALSE(std::filesystem::exists(out));
    CHECK(processes_left().empty());
  }
  // Without a timeout there is nothing for a slow process to outlast.
  const Result r = run(kCase + " --inject-fault slow-rank@0");
  CHECK(r.status == 2);
  CHECK(r.err.find("needs --comm-timeout") != std::string::npos);
}
#endif

#if defined(CPD_HAVE_MPI) && defined(CPD_HAVE_HDF5)
TEST_CASE("--inject-fault dump-write-error: a refused dump write ends the job, nothing left") {
  namespace fs = std::filesystem;
  // Named for this process: another suite's run of this test on the machine has its own.
  const fs::path dir = fs::path(tmp_dir()) / ("cpdrift_fault_dump_" + std::to_string(::getpid()));
  for (const int np : {2, 4}) {
    CAPTURE(np);
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string dump = (dir / "d.h5").string(), out = (dir / "r.json").string();
    const Result r = run_mpi(np, kCase + " --quiet --output " + out + " --dump " + dump +
                                     " --inject-fault dump-write-error@0:40");
    CAPTURE(r.err);
    CHECK(r.status == 3);
    CHECK(error_lines(r.err) == 1);
    CHECK(has_line_starting(r.err, "cpdrift: error: cannot write dump \"" + dump + "\": injected"));
    CHECK(fs::is_empty(dir));  // no dump, no report, no partial
    CHECK(processes_left().empty());
  }
  // Only rank 0 writes; the fault needs a dump; one that never fires fails the run.
  const std::string dump = (dir / "d.h5").string();
  CHECK(run(kCase + " --inject-fault dump-write-error@0").err.find("needs --dump") !=
        std::string::npos);
  CHECK(run(kCase + " --dump " + dump + " --inject-fault dump-write-error@1")
            .err.find("only rank 0 writes the dump") != std::string::npos);
  const Result never =
      run_mpi(2, kCase + " --quiet --dump " + dump + " --inject-fault dump-write-error@0:1000000");
  CHECK(never.status == 3);
  CHECK(never.err.find("nothing was injected") != std::string::npos);
  CHECK(fs::is_empty(dir));
  fs::remove_all(dir);
}
#endif

#if defined(CPD_HAVE_HDF5)
TEST_CASE("a process killed while writing leaves a partial file that the next run names") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(tmp_dir()) / ("cpdrift_partials_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string dump = (dir / "d.h5").string();
  // The dump is open (under its partial name) from before the first case to the end: a run
  // long enough to be caught in it, killed outright when its partial file shows.
  const std::string command = bin() + " --seq-len 256 --quiet --threads 1 --dump " + dump +
                              " >/dev/null 2>&1 & pid=$!; "
                              "for i in $(seq 1 200); do "
                              "  ls " +
                              dump +
                              ".cpdrift-partial.* >/dev/null 2>&1 && break; "
                              "  sleep 0.05; done; echo $pid";
  const Result started = run_command(command);
  const std::string pid = started.out.substr(0, started.out.find('\n'));
  CAPTURE(started.out);
  // The negative control of processes_left(): the running process is seen.
  const std::vector<int> running = processes_left(0);
  CHECK(std::find(running.begin(), running.end(), std::stoi(pid)) != running.end());
  ::kill(std::stoi(pid), SIGKILL);
  CHECK(processes_left().empty());
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  REQUIRE(left.size() == 1);
  CHECK(left[0].rfind("d.h5.cpdrift-partial." + pid + ".", 0) == 0);  // says whose, and partial
  CHECK_FALSE(fs::exists(dump));

  // The next run writing that path names the stale partial once, and still runs.
  const Result next = run("--smoke --quiet --dump " + dump);
  CAPTURE(next.err);
  CHECK(next.status == 0);
  CHECK(next.err.find("cpdrift: warning: a partial file of \"" + dump +
                      "\" left by a run that was killed while writing it: \"" +
                      (dir / left[0]).string() + "\"") != std::string::npos);
  CHECK(fs::exists(dump));
  // A partial whose process still runs (this one's name) is not called stale.
  fs::remove(dir / left[0]);
  fs::remove(dump);
  std::FILE* live = std::fopen((dump + ".cpdrift-partial." + std::to_string(::getpid()) + ".0@" +
                                [] {
                                  char host[256] = {};
                                  ::gethostname(host, sizeof host - 1);
                                  return std::string(host);
                                }())
                                   .c_str(),
                               "w");
  REQUIRE(live != nullptr);
  std::fclose(live);
  const Result quiet = run("--smoke --quiet --dump " + dump);
  CHECK(quiet.status == 0);
  CHECK(quiet.err.find("warning") == std::string::npos);
  fs::remove_all(dir);
}
#endif
