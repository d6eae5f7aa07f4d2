#include "engine/merge_checks.h"

#include <cmath>
#include <limits>
#include <span>
#include <string>

#include "kernels/cpu/attention.h"

namespace cpd {

void merge_oracle_row(std::span<const float* const> outs, std::span<const float> lses, int dim,
                      OracleRow& row) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  double top = neg_inf;
  for (float l : lses) top = std::max(top, static_cast<double>(l));
  row.out.assign(static_cast<std::size_t>(dim), 0.0);
  row.lse = neg_inf;
  if (top == neg_inf) return;
  double total = 0.0;
  for (std::size_t i = 0; i < lses.size(); ++i) {
    const double w = std::exp(static_cast<double>(lses[i]) - top);
    total += w;
    for (int d = 0; d < dim; ++d) row.out[d] += w * static_cast<double>(outs[i][d]);
  }
  for (double& o : row.out) o /= total;
  row.lse = top + std::log(total);
}

namespace {

float oracle_diff(float production, double oracle) {
  if (static_cast<double>(production) == oracle) return 0.0f;  // covers -inf vs -inf
  return static_cast<float>(std::fabs(static_cast<double>(production) - oracle));
}

}  // namespace

void merge_oracle_diffs(std::span<const MergeJob> jobs, const AttnShard& merged, int dim,
                        ThreadPool& pool, MergeChecks& checks) {
  pool.parallel_for(static_cast<std::int64_t>(jobs.size()), [&](std::int64_t i) {
    const MergeJob& job = jobs[static_cast<std::size_t>(i)];
    const std::size_t out = static_cast<std::size_t>(job.out - merged.out.data.data());
    const std::size_t lse = static_cast<std::size_t>(job.lse - merged.lse.data.data());
    // One set of buffers for every row of the job: this runs once per query row and head.
    std::vector<const float*> outs;
    std::vector<float> lses;
    OracleRow oracle;
    for (std::int64_t row = 0; row < job.rows; ++row) {
      outs.clear();
      lses.clear();
      for (const StateRef& s : job.states) {
        outs.push_back(s.out + row * dim);
        lses.push_back(s.lse[row]);
      }
      merge_oracle_row(outs, lses, dim, oracle);
      const std::size_t o = out + static_cast<std::size_t>(row * dim);
      for (int d = 0; d < dim; ++d)
        checks.oracle_out[o + d] = oracle_diff(merged.out.data[o + d], oracle.out[d]);
      checks.oracle_lse[lse + row] = oracle_diff(merged.lse.data[lse + row], oracle.lse);
    }
  });
}

std::string merge_oracle_self_test() {
  // Three states of a 4-wide row with lse spread over 40 nats, plus an empty block: the fold
  // and the oracle must agree to FP32 rounding, and the empty block must change nothing.
  const int dim = 4;
  const float o0[dim] = {1.0f, -2.0f, 0.5f, 3.0f}, o1[dim] = {0.25f, 0.0f, -1.0f, 2.0f};
  const float o2[dim] = {-3.0f, 1.5f, 2.0f, -0.5f}, empty[dim] = {0, 0, 0, 0};
  const std::vector<const float*> outs = {o0, o1, empty, o2};
  const std::vector<float> lses = {2.5f, -17.0f, -std::numeric_limits<float>::infinity(), 23.0f};
  float out[dim] = {0, 0, 0, 0}, lse = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < outs.size(); ++i) merge_state_row(out, &lse, outs[i], lses[i], dim);
  OracleRow oracle;
  merge_oracle_row(outs, lses, dim, oracle);
  // FP32 fold of three states: a few roundings of values ≤ 3 → well under 1e-5.
  constexpr double kTolerance = 1e-5;
  for (int d = 0; d < dim; ++d) {
    if (std::fabs(out[d] - oracle.out[d]) > kTolerance) {
      return "out[" + std::to_string(d) + "] fold " + std::to_string(out[d]) + " vs oracle " +
             std::to_string(oracle.out[d]);
    }
  }
  if (std::fabs(lse - oracle.lse) > kTolerance) {
    return "lse fold " + std::to_string(lse) + " vs oracle " + std::to_string(oracle.lse);
  }
  return "";
}

}  // namespace cpd
