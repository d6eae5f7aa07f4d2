// Everything a run produced, and the JSON report (report-contract.md) built from it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/model.h"
#include "metrics/case_result.h"
#include "metrics/gates.h"
#include "metrics/rollout_pair_metrics.h"
#include "report/json.h"

namespace cpd {

/// The report's schema (report-contract.md): compatible with the reference benchmark's.
inline constexpr const char* kReportSchema = "ws2_cp_attention_drift/v2";

/// Where and how the run happened: the report's launch and runtime blocks.
struct Provenance {
  std::string command;  // argv joined shell-style
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string launcher;  // "mpirun", "srun" or "direct"
  /// torchrun's environment (TORCHELASTIC_RUN_ID) was present at start-up: the reference's
  /// launch.torchrun and rank_env.torchrun.
  bool torchrun = false;
  std::string device = "cpu";
  bool cuda_available = false;
  std::string transport;
  int threads = 1;
  std::string simd;
  std::string compiler;
  std::string mpi_version;
  std::string hdf5_version;  // empty when built without HDF5
  std::string cuda_version;  // the CUDA runtime's; empty without the CUDA backend
  std::string nccl_version;  // empty without the NCCL transport
  std::string git_describe;
  /// The OS, as Python's platform.platform() spells it on Linux
  /// ("Linux-<release>-<machine>-with-glibc<version>").
  std::string platform;
  std::map<std::string, std::string> rank_env;
  std::string created_at_utc;
};

struct RunReport {
  Provenance provenance;
  Problem problem;
  Thresholds thresholds;
  int vocab_size = 0;  // > 0 when dlogp was requested
  RopeDrift rope;
  std::string merge_oracle_self_test;  // "" when it passed
  std::vector<CaseResult> cases;
  std::vector<PagedCaseResult> paged_cases;
  std::vector<RolloutPair> rollout_pairs;  // every (prefill case, paged case), trainer-major
  std::vector<std::string> failed_checks;
  double wall_seconds = 0.0;
  /// Per process (MPI rank order): its peak resident set over the cases, in bytes (read after
  /// the last case, before the report and the dump are written out).
  std::vector<std::uint64_t> peak_rss_bytes;

  bool passed() const { return failed_checks.empty(); }
};

/// Every gate the run fails, one line each ("<case>: <what> <value> > <threshold>").
std::vector<std::string> evaluate_checks(const RunReport& report);

/// The `ws2_cp_attention_drift/v2` report.
json::Value report_json(const RunReport& report);

/// One case's JSON object (the `cases[]` element).
json::Value case_json(const RunReport& report, const CaseResult& c);

/// One paged case's JSON object (the `paged_cases[]` element).
json::Value paged_case_json(const RunReport& report, const PagedCaseResult& c);

/// The report's `launch` and `runtime` blocks.
json::Value launch_json(const Provenance& pv);
json::Value runtime_json(const Provenance& pv);

/// The gates, as the report and acceptance.json both write them.
json::Value thresholds_json(const Thresholds& t);

/// A stats object: {max_abs, mean_abs, p95_abs, p99_abs, active_count, bitwise_equal,
/// mismatch_count, max_ulp, digest}; numbers are null (and nonfinite_count > 0) when the
/// diffs were not all finite.
json::Value stats_json(const DiffStats& s);
/// {out, lse} of a pair, with `source_class` when given.
json::Value out_lse_json(const OutLseStats& s, const char* source_class = nullptr);
/// [[begin, end], …]
json::Value ranges_json(const std::vector<Range>& ranges);

}  // namespace cpd
