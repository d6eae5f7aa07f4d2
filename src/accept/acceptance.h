// The fail-closed acceptance gate (design §7, report contract `ws2_attention_gpu_acceptance/v1`):
// the required matrix, and the evaluation of each row from executed evidence only.
#pragma once

#include <string>
#include <vector>

#include "engine/run_request.h"
#include "report/json.h"
#include "report/run_report.h"

namespace cpd {

/// The acceptance document's schema (report contract).
inline constexpr const char* kAcceptanceSchema = "ws2_attention_gpu_acceptance/v1";

/// One row of the required matrix.
struct AcceptanceRow {
  enum class Kind {
    distributed_case,      // one drift-report case: thresholds, plans, coverage, real transport
    protocol_equivalence,  // the same case under every CP protocol: bitwise equal digests
    paged_case,            // one paged case: paged thresholds, plans as requested, invariances 0
    paged_invariance,      // one invariance across the paged cases: applicable and bitwise
    rollout_pair,          // cases = {trainer, rollout}: an aligned pair, bitwise equal
    not_yet_available,     // delivered by a later part of cpdrift: fails closed
  };
  std::string name{};
  Kind kind = Kind::not_yet_available;
  bool required = true;
  int processes = 0;                 // the job size the evidence needs
  std::vector<std::string> cases{};  // report case names the row reads
  bool backward_and_dlogp = false;   // the row's case must carry both legs
  bool bitwise_topology = false;     // topology invariance must hold bitwise
  std::string unavailable_reason{};
  std::string invariance{};  // paged_invariance: the report's invariance name
};

/// The paged evidence the acceptance run executes: pages of 4 tokens, a fixed split of 8.
inline constexpr int kAcceptPageSize = 4;
inline constexpr int kAcceptFixedSplit = 8;

/// The run whose report is the evidence: TP=2 CP=2 BF16, full and chunked (split 4, and split 8
/// for the trainer-vs-rollout pair) prefill with the backward and dlogp legs under every CP
/// protocol (when the job has the 4 processes those rows need: `with_cp`), and paged prefill
/// and decode with split-KV disabled and fixed.
RunRequest evidence_request(const Problem& problem, int threads, bool with_cp);

/// The required matrix of `model`: TP=2 CP=2 BF16 full and chunked prefill (backward, dlogp),
/// CP protocol equivalence, paged prefill/decode with split-KV disabled and fixed,
/// batch/page-layout invariance, the aligned trainer-vs-rollout pair (TP=2 CP=2 split 8 vs
/// decode fixed 8) bitwise equal, and the NCCL and CUDA-IPC transports at 2/4/8 ranks.
std::vector<AcceptanceRow> required_matrix(const ModelDims& model);

/// What a row concluded.
struct RowVerdict {
  std::string name;
  bool required = true;
  std::string status{};  // passed, failed, not_run, unavailable, execution_error, invalid_report
  std::vector<std::string> errors{};
  json::Value evidence = json::Value::object();

  bool passed() const { return status == "passed"; }
};

/// Evaluates a row against a drift report (`report`: null when nothing ran). Every metric the
/// row needs must be present, a finite non-negative number, within its threshold; a fixed split
/// plan must have run as requested; the plan set must cover B·TP·CP·CP owners tiling [0, S);
/// the transport must be a real one between `row.processes` processes. Anything else fails.
RowVerdict evaluate_row(const AcceptanceRow& row, const json::Value& report, const Thresholds& t,
                        int world_size, const std::string& report_path);

/// A row's verdict before any evidence is read: its name, whether it is required, the cases it
/// reads.
RowVerdict row_verdict(const AcceptanceRow& row);

/// A row in manifest mode, which executes nothing: not_run (or unavailable for rows cpdrift
/// cannot execute yet).
RowVerdict manifest_row(const AcceptanceRow& row);

/// The acceptance document.
json::Value acceptance_json(const std::string& mode, const std::vector<RowVerdict>& rows,
                            const Thresholds& t, const json::Value& runtime,
                            const std::string& created_at);

}  // namespace cpd
