// The command line: `cpdrift [run] [options]`, `cpdrift bench [options]`,
// `cpdrift accept [options]`, `cpdrift plan [options]` and `cpdrift compare TRAIN ROLLOUT`,
// parsed into what each command needs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/run_request.h"
#include "metrics/gates.h"
#include "metrics/rl_metrics.h"

namespace cpd {

/// `cpdrift [run]`: what the engine is asked to compute, and what the CLI does with the result.
struct RunOptions {
  RunRequest request;
  std::string output;   // JSON report path; empty: none
  std::string dump;     // HDF5 tensor dump path; empty: none
  std::string inputs;   // --inputs: q, k, v from this file (request.problem.inputs once opened)
  std::string weights;  // --weights: the layer's weights from this checkpoint (--layer N)
  int layer = -1;       // --layer
  bool dump_inputs = false;
  bool overwrite = false;  // --dump may replace an existing file
  bool json = false;       // print the JSON report on stdout
  bool quiet = false;
  bool progress = false;  // progress lines on stderr even when it is not a terminal
  bool smoke = false;
  bool splits_given = false;  // --kv-chunk-sizes: each must be shorter than the sequence
  Thresholds thresholds;      // design §7's; accept's flags override them for its evidence run
};

struct BenchOptions {
  Problem problem;  // seq_len defaults to 4096 for the benchmark (4096 and 16384 on CUDA)
  bool seq_len_given = false;
  int repeats = 3;
  int threads = 0;
  Device device = Device::auto_select;
};

/// `cpdrift plan`: what the run the same flags describe would cost, predicted, not run.
struct PlanOptions {
  RunOptions run;  // the run planned (--output/--json: where the plan goes)
  /// The machine the estimates are for: "h200" (figures below, overridable) or "cpu" (this
  /// machine's kernels and copies, measured when the plan starts).
  std::string profile = "h200";
  double bf16_tflops = 990, fp32_tflops = 67, hbm_tbs = 4.8, nvlink_gbs = 450, network_gbs = 50;
  int gpus_per_node = 8;
  int processes = 0;  // the CPU profile's processes (default: the largest case's ranks)
};

struct AcceptOptions {
  std::string mode;    // "manifest" or "run"
  std::string output;  // DIR/acceptance.json; the drift report goes beside it
  Problem problem;     // seq_len defaults to 16, batch to 2
  int threads = 0;
  Thresholds thresholds;
};

/// `cpdrift compare TRAIN ROLLOUT`: two engines' logprob streams, aligned and measured.
struct CompareOptions {
  std::string train, rollout;  // the streams' paths
  std::string output;          // JSON report path; empty: none
  bool json = false, quiet = false;
  std::optional<double> max_abs_delta;  // the gate: exit 1 when |Δ| max exceeds it
  RlMetricOptions metrics;              // --ratio-band, --tis-clip, --worst
};

struct CommandLine {
  enum class Command { run, bench, accept, plan, compare, help } command = Command::run;
  RunOptions run;
  BenchOptions bench;
  PlanOptions plan;
  AcceptOptions accept;
  CompareOptions compare;
};

/// Parses argv (argv[0] excluded). Throws UsageError with one line saying what is wrong. With
/// --inputs, the checks that need the sequence length wait for the file (use_input_file).
CommandLine parse_command_line(const std::vector<std::string>& args);

/// --inputs, once the file is open: the run takes its q, k, v and its B and S, and the checks
/// that need the sequence length run. Throws UsageError as parse_command_line does.
void use_input_file(RunOptions& run, std::shared_ptr<const InputSource> source);

/// `cpdrift --help`.
std::string usage_text();

}  // namespace cpd
