// `cpdrift compare`'s report: JSON (schema cpdrift_logprob_compare/v1, docs/compare.md) and the
// human table.
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "compare/stream_comparison.h"
#include "report/json.h"

namespace cpd {

inline constexpr const char* kCompareSchema = "cpdrift_logprob_compare/v1";

struct CompareRun {
  const LogprobStream& train;
  const LogprobStream& rollout;
  const StreamComparison& comparison;
  std::optional<double> max_abs_delta;  // the gate, when given
  std::string command, created_at_utc, producer;

  /// Whether the gate passed (true without one).
  bool passed() const { return !max_abs_delta || comparison.metrics.abs_max <= *max_abs_delta; }
};

json::Value compare_json(const CompareRun& run);
void print_compare_table(std::FILE* out, const CompareRun& run);

}  // namespace cpd
