// The work the engine hands a compute backend (kernels/attention_backend.h): partial states of
// query rows against KV blocks, whole CP=1 folds, ordered merges, backward block pairs and
// logit projections. Plain descriptions of host memory: every backend reads the same jobs and
// writes the same bits (docs/numerics.md).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "core/kv_rows.h"
#include "core/range.h"
#include "cpdrift/block_merge.h"

namespace cpd {

/// Rows of one (batch, head) query range against one KV block of the matching KV head.
struct BlockJob {
  const float* q = nullptr;  // [rows][dim]
  std::int64_t first_pos = 0;
  std::int64_t rows = 0;
  const float* k = nullptr;  // [keys.size()][dim]
  const float* v = nullptr;
  Range keys;
  float* out = nullptr;  // [rows][dim]
  float* lse = nullptr;  // [rows]
};

/// Rows of one (batch, head) query range folded over KV blocks in ascending global index:
/// the whole local CP=1 computation (the reference, the topology counterpart), or a paged
/// lane reading its cache through the block table. k and v hold positions [kv_begin, …) of
/// the KV head and must cover every block.
struct FoldJob {
  const float* q = nullptr;
  std::int64_t first_pos = 0;
  std::int64_t rows = 0;
  KvRows k;
  KvRows v;
  std::int64_t kv_begin = 0;
  std::span<const Range> blocks;  // ascending; blocks wholly in the future of a row are skipped
  float* out = nullptr;
  float* lse = nullptr;
};

/// Rows [0, n) of a fold job's k and v that any of its rows sees (causal: up to the last row's
/// position), from kv_begin. A kernel reads nothing past them.
std::int64_t fold_reach(const FoldJob& job);

/// The jobs with contiguous k and v, for a backend without a paged kernel (CUDA): the rows a
/// paged job reads are copied out of their pages into `storage` (exact copies; the rest of
/// the job is unchanged), contiguous jobs are kept as they are.
std::vector<FoldJob> contiguous_fold_jobs(std::span<const FoldJob> jobs, int dim,
                                          std::deque<std::vector<float>>& storage);

/// One partial state of a merge: (out [rows][dim], lse [rows]) of the KV block `block_index`.
using StateRef = BlockState;  // cpdrift/block_merge.h

/// The states of one (batch, head, query range) to merge in global block order.
struct MergeJob {
  std::vector<StateRef> states;  // any order: the merge sorts by block index
  std::int64_t rows = 0;
  float* out = nullptr;  // [rows][dim]
  float* lse = nullptr;  // [rows]
};

/// The rows of one head that make one query block of the grid, and where their partial dq
/// against the unit's KV block goes.
struct QueryBlockRows {
  Range tokens;
  const float* q = nullptr;      // [rows][dim]
  const float* d_out = nullptr;  // [rows][dim]
  const float* lse = nullptr;    // [rows]
  const float* delta = nullptr;  // [rows]
  float* dq_partial = nullptr;   // [rows][dim], written
  /// Optional (a production lane's per-rank sums, backends with has_lane_partials): this block's
  /// dK/dV partial [keys][dim] also folded into dk_lane, dv_lane — started from it when
  /// lane_first, else added to what they hold — so that a lane can keep the fold over one
  /// query rank's blocks apart from the unit's total. Null: none.
  float* dk_lane = nullptr;
  float* dv_lane = nullptr;
  bool lane_first = false;
};

/// One head against one KV block: every query block in `blocks` (ascending, each causally
/// non-empty with the KV block) gets its partial dq; dk_total, dv_total [keys][dim] receive
/// the fold over the query blocks in order of their per-block partials — started from the
/// first block's, or, with `accumulate`, continued from what they hold (the fold of earlier
/// query blocks: a backward in rounds).
struct BackwardUnit {
  std::vector<QueryBlockRows> blocks;
  const float* k = nullptr;
  const float* v = nullptr;
  Range keys;
  float* dk_total = nullptr;
  float* dv_total = nullptr;
  bool accumulate = false;
};

/// Per-head partial logits of `rows` tokens: z[r][v] = dot_seq(hidden[r], w[v]) (logprob_math.h).
struct ProjectionJob {
  const float* hidden = nullptr;  // [rows][dim]
  std::int64_t rows = 0;
  const float* w = nullptr;  // vocab rows of `ldw` floats, already offset to the head's columns
  std::int64_t ldw = 0;
  float* z = nullptr;  // [rows][vocab]
};

/// One token block of a TokenSumJob: its first row of dy and of x, and its row count.
struct TokenBlock {
  const float* dy = nullptr;
  const float* x = nullptr;
  std::int64_t rows = 0;
};

/// A weight gradient's token sums (layer_math.h), continued over some token blocks: for each
/// block in order, P[o][i] = one fma chain from +0 over its rows ascending of dy[t][o]·x[t][i];
/// sum[o][i] = sum[o][i] + P[o][i], or P itself for the first block when the job does not
/// continue. dy's rows are ld_dy floats apart (offset to the job's first output), x's ld_x,
/// sum's ld_sum ([outputs][inputs] of a wider matrix).
struct TokenSumJob {
  std::vector<TokenBlock> blocks;
  std::int64_t ld_dy = 0, ld_x = 0, ld_sum = 0;
  int outputs = 0, inputs = 0;
  float* sum = nullptr;
  bool continues = false;
};

/// Logits of `rows` tokens folded over heads in ascending order (logprob_math.h's
/// fold_head_logits): logits[r][v] = ((z_0[r][v] + z_1[r][v]) + …) + z_last[r][v], z_h the
/// partial logits of heads[h], whose rows are the same and whose z is not written. With
/// `continues`, `logits` already holds the fold of the heads before these, which goes on
/// (continue_head_fold): logits[r][v] = ((logits[r][v] + z_0[r][v]) + …) + z_last[r][v].
struct FoldedProjectionJob {
  std::vector<ProjectionJob> heads;
  float* logits = nullptr;  // [rows][vocab]
  bool continues = false;
};

}  // namespace cpd
