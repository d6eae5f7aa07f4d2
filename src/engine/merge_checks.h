// Independent checks of the ordered merge, run on the partial states a query owner received,
// one round's rows at a time (the rounds of run_protocol).
#pragma once

#include <span>
#include <vector>

#include "core/util/thread_pool.h"
#include "engine/protocol.h"
#include "kernels/attention_backend.h"

namespace cpd {

/// |production FP32 fold − FP64 oracle| per element of the rows `jobs` merged (state_merge_jobs,
/// their states in manifest order, their rows those of `merged`), rounded to FP32, into
/// checks.oracle_out / oracle_lse: the oracle takes the same sorted states, subtracts the global
/// max lse first and forms one weighted sum in FP64 (a different but equivalent formulation). A
/// job's rows a task on `pool`.
void merge_oracle_diffs(std::span<const MergeJob> jobs, const AttnShard& merged, int dim,
                        ThreadPool& pool, MergeChecks& checks);

/// The oracle on explicit states (the per-row loop of merge_oracle_diffs, the start-up self-test
/// and the unit tests): states are (out[dim], lse) pairs in ascending block order; `row`
/// receives (out, lse) in FP64, its buffer reused.
struct OracleRow {
  std::vector<double> out;
  double lse = 0.0;
};
void merge_oracle_row(std::span<const float* const> outs, std::span<const float> lses, int dim,
                      OracleRow& row);

/// Merges fixed states with the production fold and the oracle and compares them: the
/// report's merge_oracle self-test. Returns "" when it passes, else what failed.
std::string merge_oracle_self_test();

}  // namespace cpd
