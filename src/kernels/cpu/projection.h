// The CPU backend's lm_head projection: per-head partial logits, bit-for-bit the canonical
// head_partial_logits of cpdrift/logprob_math.h.
#pragma once

#include <span>

#include "core/attention_jobs.h"
#include "core/util/thread_pool.h"

namespace cpd {

/// z[r][v] = dot_seq(hidden_r, w_v) for every row r < job.rows and v < vocab: the job's rows
/// transposed once into tiles of 16 (one SIMD lane a row), then blocks of 96 vocabulary rows,
/// each passed over by two row tiles at a time, eight vocabulary rows of w per pass over d on
/// AVX-512 (one tile and six rows on AVX2). Every output keeps its one sequential fma chain over
/// d, so the bits are those of head_partial_logits whatever the tiling.
void project_rows(const ProjectionJob& job, int dim, int vocab);

/// Every job, spread over the pool by (job, vocabulary block).
void run_projection_jobs(std::span<const ProjectionJob> jobs, int dim, int vocab, ThreadPool& pool);

/// Every job's logits folded over its heads: per (job, vocabulary block of 96), the heads in
/// ascending order, the first stored (added, for a job that `continues`) and each next one added
/// as it comes out of the tile, so the bits are those of project_rows per head followed by
/// fold_head_logits (continue_head_fold). The block's fold stays in the tile's layout (a SIMD
/// lane a row) until its last head, then goes to `logits` once.
void run_folded_projection_jobs(std::span<const FoldedProjectionJob> jobs, int dim, int vocab,
                                ThreadPool& pool);

}  // namespace cpd
