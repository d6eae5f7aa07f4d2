// JSON of the production lanes (numerics.md §10).
#pragma once

#include "report/run_report.h"

namespace cpd {

/// A case's `drift.production_lanes`: each lane vs the FP32 reference and vs the canonical merge.
json::Value lanes_case_json(const CaseResult& c);
/// The report's `production_lanes`: what each lane emulates, its figure per case, and its
/// distinct digests per (layout, split) group of cases beside the canonical merge's.
json::Value production_lanes_json(const RunReport& r);

}  // namespace cpd
