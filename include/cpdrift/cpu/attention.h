// The CPU backend's attention: partial states of query rows against KV blocks, and the
// ordered merge, bit-for-bit the canonical arithmetic of numerics/attention_math.h.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "cpdrift/core/kv_rows.h"
#include "cpdrift/core/range.h"
#include "cpdrift/cpu/thread_pool.h"
#include "cpdrift/numerics/attention_math.h"

namespace cpd {

/// Rows handled together by one kernel call: one SIMD lane per row.
inline constexpr int kTileRows = 16;

/// Reusable per-thread buffers of the tile kernel (scores of a tile against a block).
struct TileScratch {
  std::vector<float> q_transposed;  // [dim][16]
  std::vector<float> scores;        // [keys][16]
};

/// Partial states of `rows` ≤ 16 consecutive query rows (global positions first_pos …) of one
/// head against the keys `keys` of one KV head. q: [rows][dim]; k, v: keys.size() rows of dim
/// (row j holds position keys.begin + j), contiguous or paged; out: [rows][dim]; lse: [rows].
/// Row r sees the keys at positions ≤ first_pos + r. Each row's bits equal partial_state_row
/// over exactly its visible keys, whatever the tile's other rows are and wherever the key rows
/// live. dim: a multiple of 64, at most 256.
void attend_tile(const float* q, std::int64_t first_pos, int rows, const KvRows& k, const KvRows& v,
                 Range keys, int dim, float scale, ProbRounding rounding, TileScratch& scratch,
                 float* out, float* lse);

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

/// Partial states of every job, 16-row tiles spread over the pool.
void run_block_jobs(std::span<const BlockJob> jobs, int dim, float scale, ProbRounding rounding,
                    ThreadPool& pool);

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

void run_fold_jobs(std::span<const FoldJob> jobs, int dim, float scale, ProbRounding rounding,
                   ThreadPool& pool);

/// Rows [0, n) of a fold job's k and v that any of its rows sees (causal: up to the last row's
/// position), from kv_begin. A kernel reads nothing past them.
std::int64_t fold_reach(const FoldJob& job);

/// The jobs with contiguous k and v, for a backend without a paged kernel (CUDA): the rows a
/// paged job reads are copied out of their pages into `storage` (exact copies; the rest of
/// the job is unchanged), contiguous jobs are kept as they are.
std::vector<FoldJob> contiguous_fold_jobs(std::span<const FoldJob> jobs, int dim,
                                          std::deque<std::vector<float>>& storage);

/// Merges states in ascending global block index: out/lse ← s_0 ⊕ s_1 ⊕ … (left fold,
/// design §3). states[i] is (out [rows][dim], lse [rows]); `order` lists indices into
/// `states` sorted by global block index.
struct StateRef {
  int block_index = 0;
  const float* out = nullptr;
  const float* lse = nullptr;
};
void merge_in_block_order(std::span<const StateRef> states, std::int64_t rows, int dim, float* out,
                          float* lse);

}  // namespace cpd
