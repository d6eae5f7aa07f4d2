#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cpdrift/cli/commands.h"
#include "cpdrift/cli/human_output.h"
#include "cpdrift/cli/provenance.h"
#include "cpdrift/core/errors.h"
#include "cpdrift/engine/merge_checks.h"
#include "simd_info.h"

namespace cpd {

int default_threads(const CommContext& comm) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return std::max(1, static_cast<int>(cores) / std::max(1, comm.local_size()));
}

namespace {

std::unique_ptr<Transport> make_transport(const CommContext& comm) {
  if (comm.size() == 1) return std::make_unique<InProcessTransport>();
  throw UsageError(
      "multi-process runs need the MPI transport, which this build lacks; run with one process");
}

}  // namespace

int run_command(const RunOptions& options, const CommContext& comm,
                const std::string& command_line) {
  const auto started = std::chrono::steady_clock::now();
  if (options.device == Device::cuda) {
    throw UsageError("--device cuda: built without CUDA (configure with -Dcuda=enabled)");
  }
  const std::vector<CaseSpec> specs = expand_cases(options);
  const std::unique_ptr<Transport> transport = make_transport(comm);
  const bool root = comm.rank() == 0;

  RunReport report;
  report.problem = options.problem;
  report.provenance = gather_provenance(comm, command_line);
  report.provenance.transport = transport->name();
  report.provenance.threads = options.threads > 0 ? options.threads : default_threads(comm);
  report.provenance.simd = cpu_simd_isa();

  // The table goes where the JSON does not.
  std::FILE* table = options.json ? stderr : stdout;
  const bool verbose = root && !options.quiet;
  const bool progress = verbose && (isatty(STDERR_FILENO) != 0 || options.problem.seq_len >= 1024);
  if (verbose) print_header(table, report, specs.size());

  ThreadPool pool(report.provenance.threads);
  InputStore inputs(options.problem, pool);
  LocalCp1Results cp1_results;
  const RunContext ctx{options.problem, pool, inputs, *transport, comm.reducer(), cp1_results};

  report.merge_oracle_self_test = merge_oracle_self_test();
  if (options.problem.rope) report.rope = measure_rope_drift(ctx);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (progress) {
      std::fprintf(stderr, "cpdrift: [%zu/%zu] %s ...\n", i + 1, specs.size(),
                   case_name(specs[i], options.problem.dtype).c_str());
    }
    report.cases.push_back(run_case(ctx, specs[i]));
    if (verbose) print_case_row(table, report.cases.back());
  }
  report.failed_checks = evaluate_checks(report);
  report.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  if (root) {
    const std::string text = json::to_string(report_json(report));
    if (!options.output.empty()) json::write_file_atomic(options.output, text);
    if (options.json) std::fwrite(text.data(), 1, text.size(), stdout);
    if (verbose) {
      print_footer(table, report);
    } else {
      std::fprintf(table, "# Drift check : %s\n", report.passed() ? "OK" : "FAILED");
    }
  }
  return report.passed() ? kExitOk : kExitChecksFailed;
}

}  // namespace cpd
