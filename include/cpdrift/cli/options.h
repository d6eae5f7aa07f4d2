// The command line: `cpdrift [run] [options]` and `cpdrift bench [options]`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpdrift/accept/acceptance.h"
#include "cpdrift/core/plan.h"
#include "cpdrift/paged/paged_case.h"

namespace cpd {

enum class Device { auto_select, cpu, cuda };
enum class TransportChoice { auto_select, mpi, nccl, cuda_ipc };
/// What a run measures: the trainer's CP prefill (split disabled / fixed) and the rollout
/// side's paged prefill and decode.
enum class RunMode { prefill, chunked_prefill, paged_prefill, decode };

/// The command line's spellings of these choices.
const char* to_string(Device);
const char* to_string(TransportChoice);
const char* to_string(RunMode);

struct RunOptions {
  Problem problem;
  std::vector<int> tp_sizes{1, 2};
  std::vector<int> cp_sizes{1, 2};
  std::vector<std::optional<std::int64_t>> splits{std::nullopt, 4};
  std::vector<CpLayout> layouts{CpLayout::contiguous};
  std::vector<Protocol> protocols{Protocol::ag_rs};
  std::vector<RunMode> modes{RunMode::prefill, RunMode::chunked_prefill};
  // The paged modes: page size, split-KV policies (fixed at fixed_split_size, default four
  // pages), query tokens per sequence (default: make_paged_workload's).
  int page_size = 16;
  std::vector<SplitPolicy> split_policies{SplitPolicy::disabled, SplitPolicy::fixed};
  std::optional<std::int64_t> fixed_split_size;
  std::optional<std::int64_t> q_len;
  Device device = Device::auto_select;
  TransportChoice transport = TransportChoice::auto_select;
  double comm_timeout_seconds = 300.0;  // GPU transports: a wait longer than this is an error
  int staging_mib = 64;                 // cuda_ipc: each process's receive window
  int threads = 0;                      // 0: the machine's cores shared among this node's processes
  std::string output;                   // JSON report path; empty: none
  std::string dump;                     // HDF5 tensor dump path; empty: none
  bool include_backward = false;
  bool cpu_check = true;  // GPU runs also run the FP32 path on the CPU and compare the bits
  bool include_dlogp = false;
  int vocab_size = 17;
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

/// The cases of a run in report order: tp → cp → split → layout → protocol. Throws UsageError when
/// one of them cannot run on the problem (e.g. CP larger than the sequence allows).
std::vector<CaseSpec> expand_cases(const RunOptions& options);

/// The paged cases of a run: mode → split policy. Throws UsageError when the paged workload
/// cannot be built on the problem (too short, q_len too large, a fixed split that is not a
/// multiple of the page size).
std::vector<PagedCaseSpec> expand_paged_cases(const RunOptions& options);

/// The paged options of a run.
PagedOptions paged_options(const RunOptions& options);

/// `cpdrift --help`.
std::string usage_text();

}  // namespace cpd
