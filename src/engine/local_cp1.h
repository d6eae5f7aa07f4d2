// The CP=1 computations a query owner does on its own (design §4): the FP32 reference
// (one block [0, S)) and the CP=1 counterpart of a case for the topology check. The owner
// regenerates the K/V it needs; nothing crosses ranks, and no process needs the problem
// beyond the rows it owns and the keys they see.
#pragma once

#include <cstddef>
#include <map>
#include <tuple>
#include <vector>

#include "core/shard.h"
#include "engine/protocol.h"

namespace cpd {

/// How much a CP=1 memo of a process may hold: past it results are computed again when asked
/// (the same bits), so long sequences keep memory linear in S while the many small cases of a
/// matrix share their references.
inline constexpr std::size_t kCp1MemoBytes = std::size_t{64} << 20;

/// Memoised CP=1 results of this process, up to `budget_bytes`. A request whose rows lie inside
/// an earlier request's rows (same path, grid and heads or more) is served by copying, which is
/// exact: kernels are row-independent.
class LocalCp1Results {
 public:
  explicit LocalCp1Results(std::size_t budget_bytes = kCp1MemoBytes)
      : budget_bytes_(budget_bytes) {}

  /// out/lse of `rows` (batch, heads, token ranges; width ignored) folded over `grid`
  /// (ascending blocks tiling [0, S)) under `path`.
  AttnShard get(InputStore& inputs, const PathSpec& path, const std::vector<Range>& grid,
                const ShardShape& rows);

  /// Keeps nothing new from now on (what is held is still served): for the run's last case,
  /// whose results no later request can ask for.
  void stop_memoising() { budget_bytes_ = 0; }

 private:
  struct Entry {
    Range heads;
    Range tokens;
    AttnShard data;  // shape: batch, heads, {tokens}
  };
  using Key = std::tuple<int, int, std::vector<Range>>;  // inputs, rounding, grid
  std::map<Key, std::vector<Entry>> entries_;
  std::size_t budget_bytes_;
  std::size_t held_bytes_ = 0;
};

/// Computes out/lse of `rows` folded over `grid`, without memoisation.
AttnShard compute_local_cp1(InputStore& inputs, const PathSpec& path,
                            const std::vector<Range>& grid, const ShardShape& rows);

}  // namespace cpd
