// The plot's figures, measured from the dump with the summary's pairing (figures.h).
#include "inspect/drift_plot.h"

#include <algorithm>
#include <stdexcept>

#include "inspect/figures.h"
#include "report/json.h"

namespace cpd::inspect {
namespace {

// The tensors behind (column, series) of a case, or nullopt where the run has none.
std::optional<FigureSpec> plot_figure(const DumpFile& dump, const CaseInfo& c, std::size_t column,
                                      int series) {
  const std::string base = "/cases/" + c.name + "/";
  const bool bf16 = dump.problem().problem.dtype == DType::bf16;
  FigureSpec f;
  if (column <= 1) {
    const std::string t = column == 0 ? "out" : "lse";
    const char* legs[] = {"candidate_fp32", bf16 ? "candidate_bf16" : "candidate_fp32",
                          "bf16_kernel"};
    f.candidate = base + legs[series] + "/" + t;
    f.reference = base + "reference_fp32/" + t;
  } else if (column == 2) {
    if (series != 1) return std::nullopt;
    f.candidate = base + "candidate/logp";
    f.reference = base + "reference/logp";
  } else {
    if (series == 2) return std::nullopt;
    const std::string g = kPlotColumns[column];
    f.candidate = base + "candidate_fp32/" + g;
    f.reference = base + "reference_fp32/" + g;
    f.bf16_candidate = series == 1;  // the gradients' BF16 final write
  }
  if (dump.find(f.candidate) == nullptr || dump.find(f.reference) == nullptr) return std::nullopt;
  f.name = std::string(kPlotColumns[column]) + "/" + std::to_string(series);
  return f;
}

// `ranks` ∩ the logprobs' active tokens [1, S) for dlogp; `ranks` otherwise.
std::vector<Range> column_tokens(std::size_t column, std::vector<Range> ranks) {
  if (column != 2) return ranks;
  for (Range& r : ranks) r.begin = std::max<std::int64_t>(r.begin, 1);
  return ranks;
}

PlotGrid measure_grid(const DumpFile& dump, const CaseInfo& c, FigureMeter& meter,
                      const std::optional<std::vector<Range>>& rank) {
  PlotGrid grid;
  const std::int64_t seq = dump.problem().problem.seq_len;
  for (std::size_t col = 0; col < kPlotColumns.size(); ++col) {
    for (int s = 0; s < kPlotSeries; ++s) {
      std::optional<FigureSpec> f = plot_figure(dump, c, col, s);
      if (!f) continue;
      f->tokens = column_tokens(col, rank ? *rank : std::vector<Range>{Range{0, seq}});
      const DiffStats stats = meter.measure(*f);
      grid[col][static_cast<std::size_t>(s)] = stats.finite() ? stats.max_abs : -1.0;
    }
  }
  return grid;
}

// The gates as the run applied them: the report's `thresholds` (report-contract.md).
bool read_thresholds(const DumpFile& dump, Thresholds& t) {
  const std::optional<std::string> text = dump.report_json();
  if (!text) return false;
  json::Value report;
  try {
    report = json::parse(*text);
  } catch (const std::runtime_error& e) {
    throw InspectError(dump.path() + ": /report_json is not JSON: " + e.what());
  }
  if (!report.is_object() || !report.contains("thresholds")) return false;
  const json::Value& v = report.at("thresholds");
  const auto take = [&](const char* key, double& into) {
    if (v.is_object() && v.contains(key) && v.at(key).is_number()) into = v.at(key).as_double();
  };
  take("out_max_abs", t.out_max_abs);
  take("lse_max_abs", t.lse_max_abs);
  take("bf16_final_write_out_max_abs", t.bf16_write_max_abs);
  take("dlogp_max_abs", t.dlogp_max_abs);
  take("gradient_max_abs", t.gradient_max_abs);
  return true;
}

}  // namespace

std::optional<double> DriftPlot::threshold(std::size_t column, int series) const {
  const bool bf16 = dtype == DType::bf16;
  if (column == 0 && series == 0) return thresholds.out_max_abs;
  if (column == 0 && series == 1)
    return bf16 ? thresholds.bf16_write_max_abs : thresholds.out_max_abs;
  if (column == 1 && series == 0) return thresholds.lse_max_abs;
  if (column == 2 && series == 1) return thresholds.dlogp_max_abs;
  if (column >= 3 && series == 0) return thresholds.gradient_max_abs;
  return std::nullopt;  // reported, not gated
}

std::string DriftPlot::series_name(int series) const {
  switch (series) {
    case 0:
      return "FP32 CP merge / backward";
    case 1:
      return dtype == DType::bf16 ? "BF16 path as written" : "FP32 path as written";
    default:
      return "BF16 flash kernel";
  }
}

DriftPlot gather_plot(const DumpFile& dump, const std::vector<std::string>& cases,
                      ThreadPool* pool) {
  DriftPlot plot;
  plot.file = dump.path();
  plot.producer = dump.problem().producer;
  plot.problem = problem_text(dump.problem().problem);
  plot.dtype = dump.problem().problem.dtype;
  plot.thresholds_from_report = read_thresholds(dump, plot.thresholds);
  std::vector<const CaseInfo*> chosen;
  for (const std::string& name : cases) {
    const CaseInfo* c = dump.find_case(name);
    if (c == nullptr || c->paged)
      throw InspectError(dump.path() + ": no prefill case " + name + " (cpdrift-inspect list)");
    chosen.push_back(c);
  }
  for (const CaseInfo& c : dump.cases()) {
    if (c.paged) ++plot.paged_cases;
    if (cases.empty() && !c.paged) chosen.push_back(&c);
  }
  FigureMeter meter(dump, pool);
  for (const CaseInfo* c : chosen) {
    CasePlot cp;
    cp.name = c->name;
    cp.spec = c->spec;
    cp.whole = measure_grid(dump, *c, meter, std::nullopt);
    for (int r = 0; r < c->spec.cp; ++r) {
      cp.rank_tokens.push_back(rank_tokens(*c, dump.problem().problem, r));
      cp.per_rank.push_back(measure_grid(dump, *c, meter, cp.rank_tokens.back()));
    }
    meter.forget();
    plot.cases.push_back(std::move(cp));
  }
  if (plot.cases.empty()) throw InspectError(dump.path() + ": no prefill case to plot");
  return plot;
}

}  // namespace cpd::inspect
