// `cpdrift compare TRAIN ROLLOUT` (docs/compare.md): rank 0 reads, aligns, measures, prints and
// writes; every process agrees on the outcome, so a job of N processes ends as one.
#include <cstdio>

#include "cli/commands.h"
#include "comm/agree.h"
#include "compare/compare_report.h"
#include "report/provenance.h"

namespace cpd {

int compare_command(const CompareOptions& o, const CommContext& comm,
                    const std::string& command_line) {
  check_output_path(o.output, comm);
  const bool root = comm.rank() == 0;
  LogprobStream train, rollout;
  StreamComparison comparison;
  // A stream that cannot be read and an invalid comparison are bad input: status 2 everywhere.
  agree_or_throw(comm, root, "", [&] {
    train = read_logprob_stream(o.train);
    rollout = read_logprob_stream(o.rollout);
    comparison = compare_streams(train, rollout, o.metrics);
  });
  bool passed = true;
  if (root) {
    const CompareRun run{train,
                         rollout,
                         comparison,
                         o.max_abs_delta,
                         command_line,
                         utc_now(),
                         std::string("cpdrift ") + git_describe()};
    passed = run.passed();
    std::FILE* table = o.json ? stderr : stdout;
    if (!o.quiet) {
      print_compare_table(table, run);
    } else if (!passed) {
      std::fprintf(table, "# Comparison : FAILED (|Δ| max %.3e > --max-abs-delta %.3e)\n",
                   comparison.metrics.abs_max, *o.max_abs_delta);
    }
    if (!o.output.empty() || o.json) {
      const std::string text = json::to_string(compare_json(run));
      if (!o.output.empty()) json::write_file_atomic(o.output, text);
      if (o.json) std::fwrite(text.data(), 1, text.size(), stdout);
    }
  }
  passed = comm.agree(passed ? "" : "failed").empty();
  return passed ? kExitOk : kExitChecksFailed;
}

}  // namespace cpd
