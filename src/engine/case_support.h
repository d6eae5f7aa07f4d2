// Helpers the case legs share: tagged comparisons turned into statistics, and publishing a
// case tensor (digest at rank 0, and a dump when one is being written).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cpdrift/engine/case_runner.h"
#include "cpdrift/engine/tensor_stream.h"

namespace cpd::casework {

/// A local piece of a compared tensor, tagged with the CP rank whose shard it belongs to.
struct TaggedPart {
  int cp_rank;
  DiffPart part;
};

/// candidate vs reference pieces of one tensor kind.
struct Tagged {
  std::vector<TaggedPart> parts;
  void add(int cp_rank, const Shard& candidate, const Shard& reference) {
    parts.push_back(
        {cp_rank, {candidate.data.data(), reference.data.data(), candidate.data.size()}});
  }
  void add_diffs(int cp_rank, const std::vector<float>& diffs) {
    parts.push_back({cp_rank, {diffs.data(), nullptr, diffs.size()}});
  }
};

/// Statistics of the whole tensor, or of one CP rank's shard of it. Collective.
DiffStats stats_of(const RunContext& ctx, const Tagged& t,
                   std::optional<int> only_cp_rank = std::nullopt);

/// Streams the tensor made of `hosted` (one shard per hosted rank) to rank 0 and returns its
/// digest there ("" elsewhere); when dumping and `dump_path` is set, rank 0 also writes it
/// there. Collective.
std::string publish_tensor(const RunContext& ctx, const CaseGrid& grid,
                           const std::string& dump_path, const std::vector<const Shard*>& hosted,
                           int width, HeadKind heads, bool bf16);

/// The backward leg of a case from its FP32 forward (`fp32`: the FP32 path's outputs).
BackwardDrift measure_backward(const RunContext& ctx, const CaseGrid& grid,
                               const std::vector<RankOutput>& fp32, const std::string& case_name);

/// The dlogp leg: `candidate` and `reference` outputs per hosted rank.
DlogpDrift measure_dlogp(const RunContext& ctx, const CaseGrid& grid,
                         const std::vector<const AttnShard*>& candidate,
                         const std::vector<const AttnShard*>& reference,
                         const std::string& case_name);

}  // namespace cpd::casework
