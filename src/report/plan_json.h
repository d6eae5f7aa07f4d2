// JSON for a case's topology and provenance (split plans, plan set, RoPE), and the root
// launch/runtime blocks.
#pragma once

#include <vector>

#include "cpdrift/core/plan.h"
#include "cpdrift/report/run_report.h"

namespace cpd {

json::Value ranges_json(const std::vector<Range>& ranges);
json::Value topology_json(const Problem& p, const CaseSpec& spec, const Provenance& pv);
json::Value case_provenance_json(const Problem& p, const CaseSpec& spec, const Provenance& pv);

/// The split plan of CP owner `owner` (report contract, "A split plan").
json::Value split_plan_json(const Problem& p, const CaseSpec& spec, int owner);
/// The plan set: one entry per (batch_index, tp_rank, cp_rank, owner_cp_rank).
json::Value plan_set_json(const Problem& p, const CaseSpec& spec);

}  // namespace cpd
