// The CP=1 computations a query owner does on its own (design §4): the FP32 reference
// (one block [0, S)) and the CP=1 counterpart of a case for the topology check. The owner
// regenerates the K/V it needs; nothing crosses ranks, and no process needs the problem
// beyond the rows it owns and the keys they see.
#pragma once

#include <map>
#include <tuple>
#include <vector>

#include "cpdrift/core/shard.h"
#include "cpdrift/engine/protocol.h"

namespace cpd {

/// Memoised CP=1 results of this process. A request whose rows lie inside an earlier
/// request's rows (same path, grid and heads or more) is served by copying, which is exact:
/// kernels are row-independent.
class LocalCp1Results {
 public:
  /// out/lse of `rows` (batch, heads, token ranges; width ignored) folded over `grid`
  /// (ascending blocks tiling [0, S)) under `path`.
  AttnShard get(InputStore& inputs, const PathSpec& path, const std::vector<Range>& grid,
                const ShardShape& rows);

  /// Drops everything (between runs of different problems).
  void clear() { entries_.clear(); }

 private:
  struct Entry {
    Range heads;
    Range tokens;
    AttnShard data;  // shape: batch, heads, {tokens}
  };
  using Key = std::tuple<int, int, std::vector<Range>>;  // inputs, rounding, grid
  std::map<Key, std::vector<Entry>> entries_;
};

/// Computes out/lse of `rows` folded over `grid`, without memoisation.
AttnShard compute_local_cp1(InputStore& inputs, const PathSpec& path,
                            const std::vector<Range>& grid, const ShardShape& rows);

}  // namespace cpd
