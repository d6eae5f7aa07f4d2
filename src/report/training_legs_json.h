// JSON of the training and logprob legs (backward, dlogp).
#pragma once

#include "report/rl_metrics_json.h"
#include "report/run_report.h"

namespace cpd {

json::Value backward_json(const RunReport& r, const CaseResult& c);
json::Value dlogp_case_json(const CaseResult& c, DType dtype);
json::Value dlogp_root_json(const RunReport& r);
/// The report's `trainer_vs_rollout` block: how the pairs are made, and one entry per pair.
json::Value rollout_pairs_json(const RunReport& r);

}  // namespace cpd
