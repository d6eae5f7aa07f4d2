#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "report/run_report.h"

namespace cpd {
namespace {

// The gate on a statistic's max_abs (metrics/gates.h); NaN where the differences were not
// all finite.
void check_max(std::vector<std::string>& failed, const std::string& where, const DiffStats& s,
               double limit) {
  const double value = s.finite() ? s.max_abs : std::nan("");
  if (std::string why = gate_failure(where + ".max_abs", value, limit); !why.empty())
    failed.push_back(std::move(why));
}

// A statistic that is reported, not gated: it must still be finite.
void check_finite(std::vector<std::string>& failed, const std::string& where, const DiffStats& s) {
  check_max(failed, where, s, std::numeric_limits<double>::infinity());
}

// Cases that share their block grid must share every tensor's bits (design §1), whatever
// their CP, layout, protocol or TP: compared by digest, so only where digests were taken.
void check_same_grid_digests(const RunReport& report, std::vector<std::string>& failed) {
  const auto digests = [](const CaseResult& c) {
    std::vector<std::pair<std::string, std::optional<std::string>>> d = {
        {"cp_merge_fp32.out", c.cp_merge_fp32.out.digest},
        {"cp_merge_fp32.lse", c.cp_merge_fp32.lse.digest},
        {"dtype_path_vs_fp32.out", c.dtype_path.out.digest},
        {"bf16_kernel.out", c.bf16_kernel.out.digest},
        {"bf16_kernel.lse", c.bf16_kernel.lse.digest}};
    if (c.backward.available) {
      d.push_back({"backward.dq", c.backward.dq.digest});
      d.push_back({"backward.dk", c.backward.dk.digest});
      d.push_back({"backward.dv", c.backward.dv.digest});
    }
    if (c.layer.available) d.push_back({"layer.out", c.layer.out.digest});
    for (const auto& [name, s] : c.layer.backward)
      d.push_back({"layer.backward." + name, s.digest});
    if (c.dlogp.available) d.push_back({"dlogp", c.dlogp.drift.digest});
    return d;
  };
  for (std::size_t i = 0; i < report.cases.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      const CaseResult &a = report.cases[j], &b = report.cases[i];
      if (a.executed.block_bounds != b.executed.block_bounds) continue;  // the grids that ran
      const auto da = digests(a), db = digests(b);
      for (const auto& [name, x] : da) {
        for (const auto& [other, y] : db) {
          if (name == other && x && y && *x != *y) {
            failed.push_back(b.name + ": shares the block grid of " + a.name + " but its " + name +
                             " bits differ");
          }
        }
      }
      break;  // the first earlier case of the grid is the reference for the rest
    }
  }
}

// A trainer-vs-rollout pair whose KV blocks align must be bitwise equal (design §3); every
// pair's figures must be finite.
void check_pair(const RolloutPair& pair, std::vector<std::string>& failed) {
  const std::string n = pair.trainer +
                        (pair.trainer_merge == "canonical" ? "" : " [" + pair.trainer_merge + "]") +
                        " vs " + pair.rollout;
  check_finite(failed, n + ": out", pair.out);
  check_finite(failed, n + ": lse", pair.lse);
  check_finite(failed, n + ": logprob", pair.logprob);
  if (pair.layer) check_finite(failed, n + ": layer_out", *pair.layer);
  if (pair.aligned && !pair.bitwise_equal()) {
    failed.push_back(n + ": the KV blocks align but the bits differ (out " +
                     std::to_string(pair.out.mismatch_count) + ", lse " +
                     std::to_string(pair.lse.mismatch_count) + ", logprob " +
                     std::to_string(pair.logprob.mismatch_count) +
                     (pair.layer ? ", layer " + std::to_string(pair.layer->mismatch_count) : "") +
                     " elements)");
  }
}

// The gates of one prefill/chunked case.
void check_case(const RunReport& report, const CaseResult& c, std::vector<std::string>& failed) {
  const Thresholds& t = report.thresholds;
  const std::string& n = c.name;
  check_max(failed, n + ": cp_merge_fp32.out", c.cp_merge_fp32.out, t.out_max_abs);
  check_max(failed, n + ": cp_merge_fp32.lse", c.cp_merge_fp32.lse, t.lse_max_abs);
  check_max(failed, n + ": merge_oracle.out", c.merge_oracle.out, t.out_max_abs);
  check_max(failed, n + ": merge_oracle.lse", c.merge_oracle.lse, t.lse_max_abs);
  const bool bf16 = report.problem.dtype == DType::bf16;
  check_max(failed, n + ": dtype_path_vs_fp32.out", c.dtype_path.out,
            bf16 ? t.bf16_write_max_abs : t.out_max_abs);
  check_finite(failed, n + ": dtype_path_vs_fp32.lse", c.dtype_path.lse);
  check_finite(failed, n + ": bf16_kernel.out", c.bf16_kernel.out);
  check_finite(failed, n + ": bf16_kernel.lse", c.bf16_kernel.lse);
  for (const auto* s : {&c.merge_probe.out, &c.merge_probe.lse}) {
    if (s->nonfinite_count > 0) {
      failed.push_back(n + ": merge_order_probe: " + std::to_string(s->nonfinite_count) +
                       " non-finite values (the merged states hold NaN or inf)");
    } else if (!s->bitwise_equal()) {
      failed.push_back(n + ": merge_order_probe differs from the canonical merge in " +
                       std::to_string(s->mismatch_count) + " elements");
    }
  }
  if (c.backward.available) {
    check_max(failed, n + ": backward.dq", c.backward.dq, t.gradient_max_abs);
    check_max(failed, n + ": backward.dk", c.backward.dk, t.gradient_max_abs);
    check_max(failed, n + ": backward.dv", c.backward.dv, t.gradient_max_abs);
    for (const DiffStats* s : {&c.backward.bf16_dq, &c.backward.bf16_dk, &c.backward.bf16_dv})
      check_finite(failed, n + ": backward.bf16_final_write", *s);
    if (c.backward.te_p2p) {  // reported, never gated: but a non-finite figure is no figure
      const BackwardDrift::Lane& l = *c.backward.te_p2p;
      for (const DiffStats* s : {&l.dq, &l.dk, &l.dv})
        check_finite(failed, n + ": backward.production_lanes.te_p2p", *s);
    }
  }
  if (c.cuda_vs_cpu_fp32 && !c.cuda_vs_cpu_fp32->bitwise_equal()) {
    failed.push_back(n + ": cuda_vs_cpu_fp32: the GPU's FP32 path differs from the CPU's in " +
                     std::to_string(c.cuda_vs_cpu_fp32->out.mismatch_count) + " out elements");
  }
  if (c.cublas_unfused) {
    check_finite(failed, n + ": cublas_unfused.out", c.cublas_unfused->out);
    check_finite(failed, n + ": cublas_unfused.lse", c.cublas_unfused->lse);
  }
  if (c.layer.available) check_finite(failed, n + ": layer.out", c.layer.out);
  for (const auto& [name, s] : c.layer.backward)
    check_finite(failed, n + ": layer.backward." + name, s);
  if (c.dlogp.available) check_max(failed, n + ": dlogp.drift", c.dlogp.drift, t.dlogp_max_abs);
  if (c.topology_required && !c.topology.bitwise_equal()) {
    failed.push_back(n + ": topology_invariance not bitwise equal to " + c.topology_reference +
                     " (" + std::to_string(c.topology.out.mismatch_count) + " out, " +
                     std::to_string(c.topology.lse.mismatch_count) + " lse elements differ)");
  }
}

// The gates of one paged case.
void check_paged_case(const Thresholds& t, const PagedCaseResult& c,
                      std::vector<std::string>& failed) {
  const std::string& n = c.name;
  for (const std::string& e : c.coverage_errors) failed.push_back(n + ": split plan: " + e);
  check_max(failed, n + ": candidate.out", c.candidate.out, t.paged_out_max_abs);
  check_max(failed, n + ": candidate.lse", c.candidate.lse, t.paged_lse_max_abs);
  if (c.layer) check_finite(failed, n + ": layer_out", *c.layer);
  check_max(failed, n + ": dlogp", c.dlogp, t.paged_dlogp_max_abs);
  check_max(failed, n + ": fp32_split_merge.out", c.fp32.out, t.out_max_abs);
  check_max(failed, n + ": fp32_split_merge.lse", c.fp32.lse, t.lse_max_abs);
  if (!invariances_required(c.spec)) return;  // auto: a diagnostic
  for (const Invariance& inv : c.invariances) {
    if (inv.applicable && !inv.bitwise_equal()) {
      failed.push_back(n + ": invariance " + inv.name + " not bitwise equal (" +
                       std::to_string(inv.stats.out.mismatch_count) + " out, " +
                       std::to_string(inv.stats.lse.mismatch_count) + " lse elements differ)");
    }
  }
}

}  // namespace

std::vector<std::string> evaluate_checks(const RunReport& report) {
  std::vector<std::string> failed;
  if (!report.merge_oracle_self_test.empty()) {
    failed.push_back("merge_oracle self-test: " + report.merge_oracle_self_test);
  }
  check_finite(failed, "drift.rope.q", report.rope.q);
  check_finite(failed, "drift.rope.k", report.rope.k);
  for (const CaseResult& c : report.cases) check_case(report, c, failed);
  check_same_grid_digests(report, failed);
  for (const PagedCaseResult& c : report.paged_cases)
    check_paged_case(report.thresholds, c, failed);
  for (const RolloutPair& pair : report.rollout_pairs) check_pair(pair, failed);
  return failed;
}

}  // namespace cpd
