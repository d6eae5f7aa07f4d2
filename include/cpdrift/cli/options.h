// The command line: `cpdrift [run] [options]`, `cpdrift bench [options]` and
// `cpdrift accept [options]`, parsed into what each command needs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpdrift/engine/run_request.h"
#include "cpdrift/metrics/gates.h"

namespace cpd {

/// `cpdrift [run]`: what the engine is asked to compute, and what the CLI does with the result.
struct RunOptions {
  RunRequest request;
  std::string output;  // JSON report path; empty: none
  std::string dump;    // HDF5 tensor dump path; empty: none
  bool dump_inputs = false;
  bool json = false;  // print the JSON report on stdout
  bool quiet = false;
  bool smoke = false;
  Thresholds thresholds;  // design §7's; accept's flags override them for its evidence run
};

struct BenchOptions {
  Problem problem;  // seq_len defaults to 4096 for the benchmark (4096 and 16384 on CUDA)
  bool seq_len_given = false;
  int repeats = 3;
  int threads = 0;
  Device device = Device::auto_select;
};

struct AcceptOptions {
  std::string mode;    // "manifest" or "run"
  std::string output;  // DIR/acceptance.json; the drift report goes beside it
  Problem problem;     // seq_len defaults to 16, batch to 2
  int threads = 0;
  Thresholds thresholds;
};

struct CommandLine {
  enum class Command { run, bench, accept, help } command = Command::run;
  RunOptions run;
  BenchOptions bench;
  AcceptOptions accept;
};

/// Parses argv (argv[0] excluded). Throws UsageError with one line saying what is wrong.
CommandLine parse_command_line(const std::vector<std::string>& args);

/// `cpdrift --help`.
std::string usage_text();

}  // namespace cpd
