// The RL frameworks' train/rollout figures as JSON (docs/rl-metrics.md): the block every
// logprob comparison of a report carries, and `cpdrift compare` too.
#pragma once

#include <string>
#include <vector>

#include "metrics/rl_metrics.h"
#include "report/json.h"

namespace cpd {

json::Value rl_metrics_json(const RlMetrics& m);

/// [{min_UNIT, max_UNIT (null: open), tokens, abs_delta_mean, abs_delta_max}], UNIT "distance"
/// or "position".
json::Value abs_delta_bins_json(const std::vector<DistanceBin>& bins, const std::string& unit);

}  // namespace cpd
