// Test support: cases run through the engine into a report the way `cpdrift` runs them (every
// published tensor digested, dumped when a dump is given, every comparison measured).
#pragma once

#include <vector>

#include "engine/case_runner.h"
#include "report/run_recorder.h"

namespace cpd::testing {

/// The figures of `spec`. Collective like run_case.
inline CaseResult recorded_case(const RunContext& ctx, const CaseSpec& spec,
                                TensorDump* dump = nullptr, bool dumping = false) {
  RunReport r;
  RunRecorder recorder(r, ctx.collectives, ctx.pool, dumping, dump);
  run_case(ctx, spec, recorder);
  return r.cases.front();
}

/// The same for the paged cases of `specs`.
inline std::vector<PagedCaseResult> recorded_paged_cases(const RunContext& ctx,
                                                         const PagedOptions& options,
                                                         const std::vector<PagedCaseSpec>& specs) {
  RunReport r;
  RunRecorder recorder(r, ctx.collectives, ctx.pool, false, nullptr);
  run_paged_cases(ctx, options, specs, recorder);
  return r.paged_cases;
}

/// The run's RoPE check.
inline RopeDrift recorded_rope(const RunContext& ctx) {
  RunReport r;
  RunRecorder recorder(r, ctx.collectives, ctx.pool, false, nullptr);
  run_rope_check(ctx, recorder);
  return r.rope;
}

}  // namespace cpd::testing
