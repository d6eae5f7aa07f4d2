// The human table's cells (cli/human_output.cpp and its sections).
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>

#include "metrics/diff_stats.h"

namespace cpd {

/// "1.56e-02": a comparison's max |Δ|; "nonfinite" when it is not a number.
inline std::string sci(const DiffStats& s) {
  if (!s.finite()) return "nonfinite";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.2e", s.max_abs);
  return buf;
}

/// `s` padded with spaces to `width`; a line without its trailing spaces.
inline std::string padded(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}
inline std::string trimmed(std::string s) {
  s.erase(s.find_last_not_of(' ') + 1);
  return s;
}

/// "17.4%": the share of the compared elements whose bits differ.
inline std::string differing(const DiffStats& s) {
  const double share = static_cast<double>(s.mismatch_count) /
                       static_cast<double>(std::max<std::uint64_t>(s.active_count, 1));
  char text[16];
  std::snprintf(text, sizeof text, "%.1f%%", share * 100.0);
  return text;
}

}  // namespace cpd
