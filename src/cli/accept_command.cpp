// `cpdrift accept`: runs the required matrix's CPU and paged rows in this MPI job (no nested
// mpirun), evaluates every row from the executed report only, and writes the acceptance document.
#include <cstdio>
#include <filesystem>

#include "accept/acceptance.h"
#include "cli/commands.h"
#include "comm/agree.h"
#include "core/errors.h"
#include "core/util/temp_file_guard.h"
#include "report/provenance.h"

namespace cpd {
namespace {

std::string directory_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void print_rows(const std::vector<RowVerdict>& rows, const std::string& mode, bool passed) {
  std::printf("# cpdrift accept (%s): %zu rows, %s\n", mode.c_str(), rows.size(),
              kAcceptanceSchema);
  std::printf("# %-42s %-12s %s\n", "row", "status", "first reason");
  for (const RowVerdict& r : rows) {
    std::printf("  %-42s %-12s %s\n", r.name.c_str(), r.status.c_str(),
                r.errors.empty() ? "" : r.errors[0].c_str());
  }
  std::printf("# Acceptance : %s\n", passed ? "PASSED" : "FAILED");
  std::fflush(stdout);
}

}  // namespace

int accept_command(const AcceptOptions& o, const CommContext& comm,
                   const std::string& command_line) {
  const bool root = comm.rank() == 0;
  const std::string report_path = directory_of(o.output) + "/report.json";
  // A bad output directory fails every process before anything runs; nothing is created on
  // the way to it (a missing directory is the user's to make).
  agree_or_throw(comm, root, "--output: ", [&] {
    const std::string dir = directory_of(o.output);
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      throw UsageError("directory \"" + dir + "\" does not exist (mkdir -p it first)");
  });
  check_output_path(o.output, comm);  // probed, never written before the verdict

  const std::vector<AcceptanceRow> rows = required_matrix(o.problem.dims);
  json::Value report;  // null: nothing executed
  Provenance pv;       // the evidence run's, or (manifest mode) this job's
  if (o.mode == "run") {
    RunOptions evidence;
    evidence.request = evidence_request(o.problem, o.threads, comm.size() >= 4);
    evidence.output = report_path;
    evidence.thresholds = o.thresholds;  // the report the rows cite is judged by the same gates
    const RunReport run = execute_run(evidence, comm, command_line);
    if (root) report = report_json(run);
    pv = run.provenance;
  } else {
    pv = gather_provenance(comm, command_line);
    pv.transport = "none";  // manifest mode moves nothing
  }
  int status = kExitChecksFailed;
  if (root) {
    std::vector<RowVerdict> verdicts;
    for (const AcceptanceRow& row : rows) {
      verdicts.push_back(o.mode == "manifest" ? manifest_row(row)
                                              : evaluate_row(row, report, o.thresholds, comm.size(),
                                                             report.is_null() ? "" : report_path));
    }
    json::Value runtime = runtime_json(pv);
    runtime["launch"] = launch_json(pv);
    const json::Value doc =
        acceptance_json(o.mode, verdicts, o.thresholds, runtime, pv.created_at_utc);
    json::write_file_atomic(o.output, json::to_string(doc));
    note_outputs_written();
    print_rows(verdicts, o.mode, doc.at("passed").as_bool());
    status = doc.at("passed").as_bool() ? kExitOk : kExitChecksFailed;
  }
  return std::stoi(comm.broadcast(std::to_string(status), 0));
}

}  // namespace cpd
