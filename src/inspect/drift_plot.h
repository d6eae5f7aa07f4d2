// `cpdrift-inspect plot`: per prefill case, the max |diff| of out, LSE, dlogp, dq, dk and dv for
// three series (the FP32 CP merge, the dtype path, the BF16 kernel) against the gates'
// thresholds, whole and per CP rank — measured from the dump, drawn as an SVG.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "core/range.h"
#include "inspect/dump_reader.h"
#include "metrics/gates.h"

namespace cpd {
class ThreadPool;
}

namespace cpd::inspect {

inline constexpr std::array<const char*, 6> kPlotColumns = {"out", "LSE", "dlogp",
                                                            "dq",  "dk",  "dv"};
/// 0: the FP32 CP merge (out, LSE) and FP32 backward (dq, dk, dv) vs the CP=1 reference;
/// 1: the dtype path as written (out, LSE, dlogp; the gradients' BF16 final write);
/// 2: the emulated BF16 flash kernel (out, LSE).
inline constexpr int kPlotSeries = 3;

/// max |diff| per column and series; nullopt where the run has no such figure.
using PlotGrid = std::array<std::array<std::optional<double>, kPlotSeries>, kPlotColumns.size()>;

struct CasePlot {
  std::string name;
  CaseSpec spec;
  PlotGrid whole;
  std::vector<PlotGrid> per_rank;               // CP rank order
  std::vector<std::vector<Range>> rank_tokens;  // each rank's sequence positions
};

struct DriftPlot {
  std::string file, producer, problem;
  DType dtype = DType::bf16;
  Thresholds thresholds;
  bool thresholds_from_report = false;  // else cpdrift's defaults (the dump holds no report)
  std::size_t paged_cases = 0;          // not plotted
  std::vector<CasePlot> cases;

  /// The gate on (column, series), if there is one.
  std::optional<double> threshold(std::size_t column, int series) const;
  /// The series' name in the legend.
  std::string series_name(int series) const;
};

/// Measures the plot's figures from the dump (`cases`: prefill cases, all when empty).
DriftPlot gather_plot(const DumpFile& dump, const std::vector<std::string>& cases,
                      ThreadPool* pool);

/// The plot as a standalone SVG document.
std::string render_svg(const DriftPlot& plot);

}  // namespace cpd::inspect
