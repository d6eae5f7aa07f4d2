// The plot's figures, measured from the dump with the summary's pairing (figures.h).
#include "inspect/drift_plot.h"

#include <algorithm>
#include <stdexcept>

#include "inspect/figures.h"
#include "report/json.h"

namespace cpd::inspect {
namespace {

// The summary's figure (figures.h) behind each (column, series) of the plot; "" where none is.
constexpr const char* kPlotFigures[kPlotColumns.size()][kPlotSeries] = {
    {"drift.cp_merge_fp32.out", "drift.dtype_path_vs_fp32.out", "drift.bf16_kernel.out"},
    {"drift.cp_merge_fp32.lse", "drift.dtype_path_vs_fp32.lse", "drift.bf16_kernel.lse"},
    {"", "dlogp.drift", ""},
    {"backward.report.drifts[0].dq", "backward.report.drifts[0].bf16_final_write.dq", ""},
    {"backward.report.drifts[0].dk", "backward.report.drifts[0].bf16_final_write.dk", ""},
    {"backward.report.drifts[0].dv", "backward.report.drifts[0].bf16_final_write.dv", ""},
};

// max |diff| of each of the case's figures `specs` over `tokens` (the logprobs' over those ≥ 1,
// their active tokens); -1 where it is not finite.
PlotGrid measure_grid(const std::vector<FigureSpec>& specs, FigureMeter& meter,
                      const std::vector<Range>& tokens) {
  PlotGrid grid;
  for (std::size_t col = 0; col < kPlotColumns.size(); ++col) {
    for (std::size_t s = 0; s < kPlotSeries; ++s) {
      const auto spec = std::find_if(specs.begin(), specs.end(), [&](const FigureSpec& f) {
        return f.name == kPlotFigures[col][s];
      });
      if (spec == specs.end()) continue;
      FigureSpec f = *spec;
      f.digest = false;
      f.tokens = tokens;
      for (Range& r : *f.tokens) r.begin = std::max<std::int64_t>(r.begin, col == 2 ? 1 : 0);
      const DiffStats stats = meter.measure(f);
      grid[col][s] = stats.finite() ? stats.max_abs : -1.0;
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
  if (series == 1) return dtype == DType::bf16 ? "BF16 path as written" : "FP32 path as written";
  return series == 0 ? "FP32 CP merge / backward" : "BF16 flash kernel";
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
    const std::vector<FigureSpec> specs = report_figures(dump, *c);
    cp.whole = measure_grid(specs, meter, {Range{0, dump.problem().problem.seq_len}});
    for (int r = 0; r < c->spec.cp; ++r) {
      cp.rank_tokens.push_back(
          cp_owner_ranges(c->spec.layout, c->spec.cp, r, dump.problem().problem.seq_len));
      cp.per_rank.push_back(measure_grid(specs, meter, cp.rank_tokens.back()));
    }
    meter.forget();
    plot.cases.push_back(std::move(cp));
  }
  if (plot.cases.empty()) throw InspectError(dump.path() + ": no prefill case to plot");
  return plot;
}

}  // namespace cpd::inspect
