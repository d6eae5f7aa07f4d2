// The text the subcommands print: shapes, the problem, figures in scientific notation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model.h"
#include "metrics/diff_stats.h"

namespace cpd::inspect {

/// "[1, 32, 16, 128]"
std::string shape_text(const std::vector<std::int64_t>& shape);
/// "B=1 S=16 Hq=32 Hkv=8 D=128, dtype bf16, seed 2355"
std::string problem_text(const Problem& p);
/// "1.234e-05" (printf %.3e); "nonfinite" when the statistics are not finite.
std::string sci(double value);
std::string max_abs_text(const DiffStats& s);
/// The first 16 hex digits of a digest, or "-".
std::string short_digest(const std::optional<std::string>& digest);

}  // namespace cpd::inspect
