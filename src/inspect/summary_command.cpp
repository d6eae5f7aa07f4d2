// `cpdrift-inspect summary`: the report's drift figures, recomputed from the dumped tensors.
#include "core/util/thread_pool.h"
#include "inspect/command_line.h"
#include "inspect/figures.h"
#include "report/run_report.h"

namespace cpd::inspect {
namespace {

using json::Value;

struct CaseFigures {
  const CaseInfo* info;
  std::vector<Figure> figures;
  std::vector<MissingFigure> missing;
};

Value figure_json(const Figure& f) {
  return json::Object{{"figure", f.spec.name},
                      {"candidate", f.spec.candidate},
                      {"reference", f.spec.reference},
                      {"bf16_candidate", f.spec.bf16_candidate},
                      {"tokens", f.spec.tokens ? ranges_json(*f.spec.tokens) : Value(nullptr)},
                      {"stats", stats_json(f.stats)}};
}

Value summary_json(const DumpFile& dump, const std::vector<CaseFigures>& cases) {
  const auto one_case = [](const CaseFigures& c) {
    const auto missing = [](const MissingFigure& m) {
      return json::Object{{"figure", m.name}, {"reason", m.reason}};
    };
    return json::Object{{"case_name", c.info->name},
                        {"kind", c.info->paged ? "paged" : "prefill"},
                        {"figures", json::array_of(c.figures, figure_json)},
                        {"not_in_dump", json::array_of(c.missing, missing)}};
  };
  return json::Object{
      {"file", dump.path()},
      {"schema_version", dump.problem().schema_version},
      {"producer", dump.problem().producer},
      {"statistics", "metrics/diff_stats.h compute_diff_stats over the dumped tensors"},
      {"cases", json::array_of(cases, one_case)}};
}

std::string case_line(const CaseInfo& c) {
  if (c.paged) return "paged case " + c.name;
  const CaseSpec& s = c.spec;
  return "case " + c.name + ": tp " + std::to_string(s.tp) + ", cp " + std::to_string(s.cp) +
         ", split " + (s.split ? std::to_string(*s.split) : std::string("none")) + ", " +
         to_string(s.layout) + ", " + to_string(s.protocol);
}

void print_text(std::FILE* out, const DumpFile& dump, const std::vector<CaseFigures>& cases) {
  const DumpProblem& d = dump.problem();
  std::fprintf(out, "# cpdrift-inspect summary: %s (%s, %s)\n", dump.path().c_str(),
               d.producer.empty() ? "producer unknown" : d.producer.c_str(),
               d.schema_version.c_str());
  std::fprintf(out, "# problem : %s\n", problem_text(d.problem).c_str());
  std::fprintf(out,
               "# the report's figures recomputed from the dumped tensors by cpdrift's statistics "
               "(|candidate - reference|; --json: every digit)\n");
  for (const CaseFigures& c : cases) {
    std::fprintf(out, "#\n# %s\n", case_line(*c.info).c_str());
    std::fprintf(out, "#   %-62s %-10s %-10s %-10s %-10s %10s %10s %10s %-7s %s\n", "figure",
                 "max_abs", "mean_abs", "p95_abs", "p99_abs", "active", "mismatches", "max_ulp",
                 "bitwise", "digest");
    for (const Figure& f : c.figures) {
      const DiffStats& s = f.stats;
      const bool ok = s.finite();
      std::fprintf(out, "    %-62s %-10s %-10s %-10s %-10s %10llu %10llu %10llu %-7s %s\n",
                   f.spec.name.c_str(), max_abs_text(s).c_str(), ok ? sci(s.mean_abs).c_str() : "-",
                   ok ? sci(s.p95_abs).c_str() : "-", ok ? sci(s.p99_abs).c_str() : "-",
                   static_cast<unsigned long long>(s.active_count),
                   static_cast<unsigned long long>(s.mismatch_count),
                   static_cast<unsigned long long>(s.max_ulp), s.bitwise_equal() ? "yes" : "no",
                   s.digest ? s.digest->substr(0, 16).c_str() : "-");
    }
    for (const MissingFigure& m : c.missing)
      std::fprintf(out, "#   not in the dump: %s (%s)\n", m.name.c_str(), m.reason.c_str());
  }
}

}  // namespace

int summary_command(const Arguments& a, std::FILE* out) {
  const DumpFile dump = DumpFile::open(a.operands[0]);
  std::vector<const CaseInfo*> selected;
  for (const std::string& name : a.values("--case")) {
    selected.push_back(dump.find_case(name));
    if (selected.back() == nullptr)
      throw InspectError(dump.path() + ": no case " + name + " (cpdrift-inspect list names them)");
  }
  if (selected.empty()) {
    for (const CaseInfo& c : dump.cases()) selected.push_back(&c);
  }
  ThreadPool pool(measure_threads());
  FigureMeter meter(dump, &pool);
  std::vector<CaseFigures> cases;
  for (const CaseInfo* c : selected) {
    CaseFigures cf{c, {}, missing_figures(dump, *c)};
    for (FigureSpec& spec : report_figures(dump, *c)) {
      DiffStats stats = meter.measure(spec);
      cf.figures.push_back(Figure{std::move(spec), std::move(stats)});
    }
    meter.forget();
    cases.push_back(std::move(cf));
  }
  if (a.json) {
    std::fputs(json::to_string(summary_json(dump, cases)).c_str(), out);
  } else {
    print_text(out, dump, cases);
  }
  return 0;
}

}  // namespace cpd::inspect
