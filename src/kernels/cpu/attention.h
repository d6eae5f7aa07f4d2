// The CPU backend's attention: partial states of query rows against KV blocks, bit-for-bit the
// canonical arithmetic of cpdrift/attention_math.h (the ordered merge is cpdrift/block_merge.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/attention_jobs.h"
#include "core/float_buffer.h"
#include "core/util/thread_pool.h"
#include "cpdrift/attention_math.h"

namespace cpd {

/// Rows of one lane tile: one SIMD lane per row.
inline constexpr int kTileRows = 16;
/// Rows of one forward kernel call: four lane tiles, which share every K and V row they read.
inline constexpr int kAttendRows = 4 * kTileRows;
/// Keys of V that the forward kernel's P·V takes at a time for all its rows: each row group's
/// accumulators stay in registers over the whole chunk, whose 64-column halves and coefficients
/// stay in L2.
inline constexpr std::int64_t kAttendKeyChunk = 512;

/// Reusable per-thread buffers of the tile kernel (scores of its lane tiles against a block).
struct TileScratch {
  std::vector<float> q_transposed;  // per lane tile [dim][16]
  FloatBuffer scores;               // per lane tile [keys][16] (8 MB at S = 32768, one block)
};

/// Partial states of `rows` ≤ 64 consecutive query rows (global positions first_pos …) of one
/// head against the keys `keys` of one KV head. q: [rows][dim]; k, v: keys.size() rows of dim
/// (row j holds position keys.begin + j), contiguous or paged; out: [rows][dim]; lse: [rows].
/// Row r sees the keys at positions ≤ first_pos + r. Each row's bits equal partial_state_row
/// over exactly its visible keys, whatever the tile's other rows are and wherever the key rows
/// live. dim: a multiple of 64, at most 256.
void attend_tile(const float* q, std::int64_t first_pos, int rows, const KvRows& k, const KvRows& v,
                 Range keys, int dim, float scale, ProbRounding rounding, TileScratch& scratch,
                 float* out, float* lse);

/// Partial states of every job, tiles of 64 rows spread over the pool.
void run_block_jobs(std::span<const BlockJob> jobs, int dim, float scale, ProbRounding rounding,
                    ThreadPool& pool);

/// Every fold job: its rows' states against each block in ascending order, merged as they come.
void run_fold_jobs(std::span<const FoldJob> jobs, int dim, float scale, ProbRounding rounding,
                   ThreadPool& pool);

}  // namespace cpd
