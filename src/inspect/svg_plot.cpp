// The drift plot as SVG, written by hand (no plotting library): one panel per case — the max
// |diff| of each column and series on a shared log axis with each gate drawn, then one strip per
// CP rank whose cells give the rank's figures, coloured by their headroom to the gate.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "inspect/drift_plot.h"

namespace cpd::inspect {
namespace {

constexpr double kWidth = 868, kLeft = 112, kColumn = 116, kSlot = 36;
constexpr double kChart = 230;  // the log axis' height
constexpr double kRankRow = 30;
constexpr const char* kColors[kPlotSeries] = {"#1f6fb4", "#e07b00", "#2a9d3c"};
constexpr const char* kFail = "#d62728";

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string esc(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const char* entity = c == '&'   ? "&amp;"
                         : c == '<' ? "&lt;"
                         : c == '>' ? "&gt;"
                         : c == '"' ? "&quot;"
                                    : nullptr;
    out += entity != nullptr ? std::string(entity) : std::string(1, c);
  }
  return out;
}

// "3.1e-3", "0": short enough for a cell.
std::string value_label(double v) {
  if (v == 0) return "0";
  if (v < 0) return "nonfinite";
  const int e = static_cast<int>(std::floor(std::log10(v)));
  double m = v / std::pow(10.0, e);
  if (m >= 9.95) return "1.0e" + std::to_string(e + 1);
  return fmt("%.1f", m) + "e" + std::to_string(e);
}

// A sequence position, "64k" for a large multiple of 1024 (a rank label must fit the margin).
std::string position(std::int64_t p) {
  if (p >= 10240 && p % 1024 == 0) return std::to_string(p / 1024) + "k";
  return std::to_string(p);
}

std::string text(double x, double y, const std::string& s, const std::string& attrs = "") {
  return "<text x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", y) + "\" " + attrs + ">" + esc(s) +
         "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const std::string& attrs) {
  return "<line x1=\"" + fmt("%.1f", x1) + "\" y1=\"" + fmt("%.1f", y1) + "\" x2=\"" +
         fmt("%.1f", x2) + "\" y2=\"" + fmt("%.1f", y2) + "\" " + attrs + "/>\n";
}

// The series' marker at (x, y): a circle, a square, a triangle; hollow for a bitwise 0.
std::string marker(int series, double x, double y, bool hollow, double size = 5.5) {
  const std::string color = kColors[series];
  const std::string paint = hollow ? "fill=\"white\" stroke=\"" + color + "\" stroke-width=\"1.8\""
                                   : "fill=\"" + color + "\" stroke=\"white\" stroke-width=\"1\"";
  if (series == 0)
    return "<circle cx=\"" + fmt("%.1f", x) + "\" cy=\"" + fmt("%.1f", y) + "\" r=\"" +
           fmt("%.1f", size) + "\" " + paint + "/>\n";
  if (series == 1)
    return "<rect x=\"" + fmt("%.1f", x - size) + "\" y=\"" + fmt("%.1f", y - size) +
           "\" width=\"" + fmt("%.1f", 2 * size) + "\" height=\"" + fmt("%.1f", 2 * size) + "\" " +
           paint + "/>\n";
  const double s = size * 1.15;
  return "<path d=\"M" + fmt("%.1f", x) + "," + fmt("%.1f", y - s) + " L" + fmt("%.1f", x + s) +
         "," + fmt("%.1f", y + s * 0.8) + " L" + fmt("%.1f", x - s) + "," +
         fmt("%.1f", y + s * 0.8) + " Z\" " + paint + "/>\n";
}

// The decades the axis spans: every plotted value and threshold, at least four decades.
std::pair<int, int> decades(const DriftPlot& p) {
  double lo = 1e300, hi = 0;
  const auto see = [&](double v) {
    if (v > 0) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  };
  for (const CasePlot& c : p.cases) {
    for (const auto& col : c.whole)
      for (const auto& v : col) see(v.value_or(0));
  }
  for (std::size_t col = 0; col < kPlotColumns.size(); ++col)
    for (int s = 0; s < kPlotSeries; ++s) see(p.threshold(col, s).value_or(0));
  int a = static_cast<int>(std::floor(std::log10(lo))),
      b = static_cast<int>(std::ceil(std::log10(hi)));
  if (b - a < 4) a = b - 4;
  return {a, b};
}

// Cell colour of a rank's figure: its ratio to the gate (green: far below; yellow: within 2x;
// red: above), grey where nothing gates it.
std::pair<const char*, const char*> cell_colors(double v, std::optional<double> gate) {
  if (v < 0) return {kFail, "white"};
  if (!gate) return {"#ececec", "#222"};
  const double ratio = v / *gate;
  if (ratio > 1) return {kFail, "white"};
  if (ratio > 0.5) return {"#fee391", "#222"};
  if (ratio > 0.05) return {"#b8e186", "#222"};
  return {"#e6f5d0", "#222"};
}

class Writer {
 public:
  explicit Writer(const DriftPlot& p) : p_(p), range_(decades(p)) {}

  std::string render() {
    double y = header();
    for (const CasePlot& c : p_.cases) y = panel(c, y);
    return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", kWidth) +
           "\" height=\"" + fmt("%.0f", y + 10) + "\" viewBox=\"0 0 " + fmt("%.0f", kWidth) + " " +
           fmt("%.0f", y + 10) +
           "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" fill=\"#222\">\n"
           "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n" +
           body_ + "</svg>\n";
  }

 private:
  double y_of(double v, double top) const {
    const double l = std::clamp(std::log10(v), double(range_.first), double(range_.second));
    return top + kChart * (range_.second - l) / (range_.second - range_.first);
  }
  static double column_center(std::size_t col) { return kLeft + kColumn * (col + 0.5); }
  static double slot(std::size_t col, int s) { return column_center(col) + (s - 1) * kSlot; }

  double header() {
    body_ += text(16, 26, "cpdrift attention drift: " + p_.file,
                  "font-size=\"17\" font-weight=\"bold\"");
    body_ += text(16, 46, p_.problem + (p_.producer.empty() ? "" : ", " + p_.producer),
                  "font-size=\"12\" fill=\"#555\"");
    body_ += text(16, 63,
                  "max |candidate - reference| against the FP32 CP=1 reference, per tensor and "
                  "path",
                  "font-size=\"12\" fill=\"#555\"");
    std::string note = p_.thresholds_from_report
                           ? "gates: the run's thresholds, from the report in the dump"
                           : "gates: cpdrift's default thresholds (the dump holds no report)";
    if (p_.paged_cases > 0)
      note += "; its " + std::to_string(p_.paged_cases) + " paged case(s) are not plotted";
    body_ += text(16, 79, note, "font-size=\"12\" fill=\"#555\"");
    // Legend: the series, then the gate line, a bitwise 0 and a figure above its gate.
    double x = 16;
    const double y = 104;
    for (int s = 0; s < kPlotSeries; ++s) {
      body_ += marker(s, x + 6, y - 4, false);
      body_ += text(x + 16, y, p_.series_name(s), "font-size=\"12\"");
      x += 34 + 7.2 * static_cast<double>(p_.series_name(s).size());
    }
    body_ += line(x, y - 4, x + 26, y - 4,
                  "stroke=\"#555\" stroke-width=\"1.6\" stroke-dasharray=\"5,3\"");
    body_ += text(x + 32, y, "gate", "font-size=\"12\"");
    x = 16;
    const double y2 = 126;
    body_ += marker(0, x + 6, y2 - 4, true);
    body_ += text(x + 16, y2, "0: bitwise equal", "font-size=\"12\"");
    x += 140;
    body_ += marker(0, x + 6, y2 - 4, false);
    body_ += "<circle cx=\"" + fmt("%.1f", x + 6) + "\" cy=\"" + fmt("%.1f", y2 - 4) +
             "\" r=\"9\" fill=\"none\" stroke=\"" + kFail + "\" stroke-width=\"2\"/>\n";
    body_ += text(x + 20, y2, "above its gate", "font-size=\"12\"");
    x += 130;
    body_ += text(x, y2, "rank cells:", "font-size=\"12\"");
    x += 72;
    const struct {
      const char* fill;
      const char* label;
    } keys[] = {{"#e6f5d0", "< 5% of gate"},
                {"#b8e186", "< 50%"},
                {"#fee391", "< 100%"},
                {kFail, "above"},
                {"#ececec", "no gate"}};
    for (const auto& k : keys) {
      body_ += "<rect x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", y2 - 12) +
               "\" width=\"14\" height=\"14\" fill=\"" + k.fill +
               "\" stroke=\"#999\" stroke-width=\"0.5\"/>\n";
      body_ += text(x + 18, y2, k.label, "font-size=\"11.5\"");
      x += 30 + 7.0 * static_cast<double>(std::string(k.label).size());
    }
    return 144;
  }

  double panel(const CasePlot& c, double top) {
    const CaseSpec& s = c.spec;
    body_ += line(12, top, kWidth - 12, top, "stroke=\"#bbb\" stroke-width=\"1\"");
    body_ += text(16, top + 22, c.name, "font-size=\"15\" font-weight=\"bold\"");
    body_ += text(16, top + 39,
                  "TP " + std::to_string(s.tp) + " · CP " + std::to_string(s.cp) + " · split " +
                      (s.split ? std::to_string(*s.split) : std::string("none")) + " · " +
                      to_string(s.layout) + " · " + to_string(s.protocol),
                  "font-size=\"12\" fill=\"#555\"");
    const double chart_top = top + 58, chart_bottom = chart_top + kChart;
    const double zero_y = chart_bottom + 20, labels_y = zero_y + 26;
    axis(chart_top, chart_bottom, zero_y, labels_y);
    for (std::size_t col = 0; col < kPlotColumns.size(); ++col) gates(col, chart_top);
    for (std::size_t col = 0; col < kPlotColumns.size(); ++col) {
      for (int ser = 0; ser < kPlotSeries; ++ser) {
        const std::optional<double> v = c.whole[col][static_cast<std::size_t>(ser)];
        if (v) point(col, ser, *v, chart_top, zero_y);
      }
    }
    return strips(c, labels_y + 16);
  }

  void axis(double top, double bottom, double zero_y, double labels_y) {
    const double right = kLeft + kColumn * kPlotColumns.size();
    body_ += "<rect x=\"" + fmt("%.1f", kLeft) + "\" y=\"" + fmt("%.1f", top) + "\" width=\"" +
             fmt("%.1f", right - kLeft) + "\" height=\"" + fmt("%.1f", bottom - top) +
             "\" fill=\"#fbfbfb\" stroke=\"#888\" stroke-width=\"1\"/>\n";
    for (int e = range_.first; e <= range_.second; ++e) {
      const double y = y_of(std::pow(10.0, e), top);
      if (e > range_.first && e < range_.second)
        body_ += line(kLeft, y, right, y, "stroke=\"#e2e2e2\" stroke-width=\"1\"");
      body_ +=
          text(kLeft - 8, y + 4, "1e" + std::to_string(e), "font-size=\"11\" text-anchor=\"end\"");
    }
    body_ += "<text transform=\"translate(22," + fmt("%.1f", (top + bottom) / 2) +
             ") rotate(-90)\" font-size=\"12\" text-anchor=\"middle\">max |diff| (log)</text>\n";
    body_ += line(kLeft, zero_y, right, zero_y,
                  "stroke=\"#bbb\" stroke-width=\"1\" stroke-dasharray=\"2,3\"");
    body_ += text(kLeft - 8, zero_y + 4, "0", "font-size=\"11\" text-anchor=\"end\"");
    for (std::size_t col = 0; col < kPlotColumns.size(); ++col) {
      if (col > 0) {
        const double x = kLeft + kColumn * col;
        body_ += line(x, top, x, zero_y + 8, "stroke=\"#d0d0d0\" stroke-width=\"1\"");
      }
      body_ += text(column_center(col), labels_y, kPlotColumns[col],
                    "font-size=\"13\" font-weight=\"bold\" text-anchor=\"middle\"");
    }
  }

  // Each gate of a column as a dashed line across it, in its series' colour, labelled.
  void gates(std::size_t col, double top) {
    std::vector<std::pair<double, int>> drawn;  // value, series (-1: several)
    for (int s = 0; s < kPlotSeries; ++s) {
      const std::optional<double> g = p_.threshold(col, s);
      if (!g) continue;
      auto same =
          std::find_if(drawn.begin(), drawn.end(), [&](const auto& d) { return d.first == *g; });
      if (same != drawn.end())
        same->second = -1;
      else
        drawn.emplace_back(*g, s);
    }
    const double left = kLeft + kColumn * col + 4, right = left + kColumn - 8;
    for (const auto& [g, s] : drawn) {
      const std::string color = s < 0 ? "#555" : kColors[s];
      const double y = y_of(g, top);
      body_ += line(left, y, right, y,
                    "stroke=\"" + color + "\" stroke-width=\"1.6\" stroke-dasharray=\"5,3\"");
      body_ += text(right, y - 4, "gate " + value_label(g),
                    "font-size=\"10\" text-anchor=\"end\" fill=\"" + color + "\"");
    }
  }

  void point(std::size_t col, int s, double v, double top, double zero_y) {
    const double x = slot(col, s);
    const std::optional<double> gate = p_.threshold(col, s);
    if (v < 0) {  // not finite
      body_ += text(x, top + 12, "NaN/inf",
                    "font-size=\"10\" text-anchor=\"middle\" fill=\"" + std::string(kFail) + "\"");
      return;
    }
    const double y = v == 0 ? zero_y : y_of(v, top);
    body_ += marker(s, x, y, v == 0);
    const bool above = gate && v > *gate;
    if (above)
      body_ += "<circle cx=\"" + fmt("%.1f", x) + "\" cy=\"" + fmt("%.1f", y) +
               "\" r=\"9\" fill=\"none\" stroke=\"" + kFail + "\" stroke-width=\"2\"/>\n";
    if (v > 0) {
      body_ += text(x, y + 17, value_label(v),
                    "font-size=\"9.5\" text-anchor=\"middle\" fill=\"" +
                        std::string(above ? kFail : "#333") + "\"");
    }
  }

  // One row of cells per CP rank: each (column, series) the case has, the rank's figure.
  double strips(const CasePlot& c, double top) {
    body_ += text(16, top + 12,
                  "per CP rank: max |diff| over the rank's query (and KV) positions, each cell "
                  "framed in its series' colour",
                  "font-size=\"12\" font-weight=\"bold\"");
    double y = top + 22;
    for (std::size_t r = 0; r < c.per_rank.size(); ++r) {
      std::string tokens;
      for (const Range& t : c.rank_tokens[r])
        tokens +=
            (tokens.empty() ? "" : "+") + ("[" + position(t.begin) + "," + position(t.end) + ")");
      body_ += text(kLeft - 8, y + 12, "rank " + std::to_string(r),
                    "font-size=\"11\" font-weight=\"bold\" text-anchor=\"end\"");
      body_ +=
          text(kLeft - 8, y + 24, tokens, "font-size=\"9.5\" fill=\"#555\" text-anchor=\"end\"");
      for (std::size_t col = 0; col < kPlotColumns.size(); ++col) {
        for (int s = 0; s < kPlotSeries; ++s) {
          const std::optional<double> v = c.per_rank[r][col][static_cast<std::size_t>(s)];
          if (!v) continue;
          const auto [fill, ink] = cell_colors(*v, p_.threshold(col, s));
          const double x = slot(col, s) - kSlot / 2 + 1;
          body_ += "<rect x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"" +
                   fmt("%.1f", kSlot - 2) + "\" height=\"20\" rx=\"2\" fill=\"" + fill +
                   "\" stroke=\"" + kColors[s] + "\" stroke-width=\"1.2\"/>\n";
          body_ +=
              text(x + (kSlot - 2) / 2, y + 13, value_label(*v),
                   "font-size=\"9.5\" text-anchor=\"middle\" fill=\"" + std::string(ink) + "\"");
        }
      }
      y += kRankRow;
    }
    return y + 18;
  }

  const DriftPlot& p_;
  std::pair<int, int> range_;
  std::string body_;
};

}  // namespace

std::string render_svg(const DriftPlot& plot) { return Writer(plot).render(); }

}  // namespace cpd::inspect
