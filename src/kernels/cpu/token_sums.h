// The CPU backend's weight-gradient token sums: TokenSumJob's definition, tiled.
#pragma once

#include <span>

#include "core/attention_jobs.h"
#include "core/util/thread_pool.h"

namespace cpd {

/// Every job (core/attention_jobs.h's TokenSumJob), spread over the pool by (job, 256 columns):
/// a task takes the job's blocks in order and passes every output over its columns of the block
/// while that x panel is in cache. A tile keeps 8 outputs × 32 columns of the block's partials in
/// registers over its rows — a broadcast of dy and two loads of x per 16 fmas — and adds them to
/// `sum` at the block's end, so every element keeps its chain over the block's rows and the fold
/// over the blocks in order: the definition's bits.
void run_token_sum_jobs(std::span<const TokenSumJob> jobs, ThreadPool& pool);

/// One job on the calling thread, by the definition (layer_math.h's token_block_partial and
/// fold_token_block): the tests' and other backends' reference.
void token_sums_reference(const TokenSumJob& job);

}  // namespace cpd
