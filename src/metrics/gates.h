// The gates a run is judged by (design §7, from the reference contract), and the one rule every
// gate applies: a metric passes only as a finite, non-negative number within its limit.
#pragma once

#include <optional>
#include <string>

namespace cpd {

struct Thresholds {
  double out_max_abs = 2.0e-4;         // cp_merge_fp32 out
  double lse_max_abs = 2.0e-4;         // cp_merge_fp32 lse, and the FP64 merge oracle
  double bf16_write_max_abs = 2.0e-2;  // dtype_path_vs_fp32 out under a BF16 final write
  double dlogp_max_abs = 5.0e-2;       // selected-token logprobs
  double gradient_max_abs = 5.0e-2;    // dq, dk, dv
  double paged_out_max_abs = 1.0e-2;   // paged lanes (rollout side): out as written
  double paged_lse_max_abs = 2.0e-3;
  double paged_dlogp_max_abs = 2.0e-3;
};

/// The one rule of every gate, the report's checks and the acceptance rows alike: a metric
/// passes only as a finite, non-negative number within `limit`. `value` is nullopt where the
/// metric is missing, NaN or infinite where it is not finite. "" when it passes, else why not:
/// "missing metric W", "non-finite metric W", "negative metric W" or "W = x exceeds L".
std::string gate_failure(const std::string& what, std::optional<double> value, double limit);

}  // namespace cpd
