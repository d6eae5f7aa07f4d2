// `cpdrift bench`'s rows of the layer's projections (--scope layer's q_proj and o_proj).
#pragma once

#include "core/model.h"
#include "core/util/thread_pool.h"

namespace cpd {

/// Times q_proj (every query head, S tokens) and o_proj (every head group folded) with the CPU
/// projection tile over `pool`, prints each row's GFLOP/s and share of `peak` FLOP/s, and says
/// whether a sample of their outputs has the bits of layer_math.h's definitions (project_row,
/// o_proj_groups; FP64-checked in the tests).
void bench_layer_projections(const Problem& p, int repeats, double peak, ThreadPool& pool);

}  // namespace cpd
