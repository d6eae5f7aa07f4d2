// Generation of the global input tensors, one shard at a time (design §2).
#pragma once

#include <vector>

#include "core/model.h"
#include "core/shard.h"
#include "core/util/thread_pool.h"
#include "cpdrift/philox.h"

namespace cpd {

/// Fills `shape` (heads are Q heads for q and d_out, KV heads for k and v; width head_dim) of
/// tensor `tensor` of `problem`: standard normals at their global coordinates
/// ((b·H + h)·S + s)·D + d, shaped by problem.distribution (cpdrift/input_shape.h), RoPE at
/// the global position for q and k when problem.rope, then the precision's rounding. With
/// problem.inputs, q, k and v are the file's rows instead (RoPE only where the file holds them
/// before it, at the file's positions), then the same rounding. Any slice equals the same slice cut
/// from the whole tensor.
Shard generate_shard(const Problem& problem, TensorId tensor, const ShardShape& shape,
                     InputPrecision precision, ThreadPool& pool);

/// Columns [columns) of the synthetic FP32 lm_head W[vocab, Hq·D]: element (v, c) is the normal
/// at linear index v·Hq·D + c of TensorId::lm_head times float(1/sqrt(Hq·D)) (one FP32 product;
/// the usual fan-in scale keeps the logits O(1)). Returned row-major [vocab][columns.size()].
std::vector<float> lm_head_columns(const Problem& problem, int vocab, Range columns);

/// Query head `head`'s D columns of the lm_head, [vocab][D]: lm_head_columns(problem, vocab,
/// [head·D, (head+1)·D)) element for element, generated over `pool` by vocabulary rows.
std::vector<float> lm_head_plane(const Problem& problem, int vocab, std::int64_t head,
                                 ThreadPool& pool);

/// Rows [rows) of the layer's synthetic FP32 lm_head W[vocab, hidden] (--scope layer: it reads
/// the layer's output), [rows.size()][hidden]: element (v, c) the normal at linear index
/// v·hidden + c of TensorId::lm_head times float(1/sqrt(hidden)), as lm_head_columns with the
/// hidden size for the width; generated over `pool` by vocabulary rows.
std::vector<float> layer_lm_head_rows(const Problem& problem, Range rows, ThreadPool& pool);

}  // namespace cpd
