// Independent checks of the ordered merge, run on the partial states a query owner received.
#pragma once

#include <vector>

#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/engine/protocol.h"

namespace cpd {

/// The rank's states merged again from the reverse of their arrival order. The merge sorts by
/// global block index, so this must equal RankOutput::merged bit for bit (the report's
/// merge_order_probe).
AttnShard merge_reversed_arrivals(const RankOutput& rank, int dim, AttentionBackend& backend);

/// |production FP32 fold − FP64 oracle| per element, rounded to FP32: the oracle takes the
/// same sorted states, subtracts the global max lse first and forms one weighted sum in FP64
/// (a different but equivalent formulation). Layouts follow RankOutput::merged.
struct OracleDiffs {
  std::vector<float> out;
  std::vector<float> lse;
};
OracleDiffs merge_oracle_diffs(const RankOutput& rank, int dim);

/// The oracle on explicit states, for the start-up self-test and the unit tests: states are
/// (out[dim], lse) pairs in ascending block order; returns (out, lse) in FP64.
struct OracleRow {
  std::vector<double> out;
  double lse;
};
OracleRow merge_oracle_row(const std::vector<const float*>& outs, const std::vector<float>& lses,
                           int dim);

/// Merges fixed states with the production fold and the oracle and compares them: the
/// report's merge_oracle self-test. Returns "" when it passes, else what failed.
std::string merge_oracle_self_test();

}  // namespace cpd
