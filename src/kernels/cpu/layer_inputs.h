// The layer's q, k and v (--scope layer, docs/numerics.md §11): the projections of its hidden
// states, computed where generate_shard would draw the core's.
#pragma once

#include <functional>
#include <span>

#include "core/attention_jobs.h"
#include "core/model.h"
#include "core/shard.h"
#include "core/util/thread_pool.h"

namespace cpd {

/// generate_shard's contract for q, k, v and dO of a layer problem: row (b, h, pos) is
/// y = project_row(hidden(b, pos), head h's rows of the projection) (+ the bias), then the
/// head's RMSNorm where the model has q_norm / k_norm, then RoPE at pos (q and k, when
/// problem.rope), then the precision's rounding. Every output is one fma chain over the hidden
/// dim (the tiled kernel's bits), so no shard shape or head split changes one. dO (d_out, query
/// heads) is the gradient o_proj hands the core: row (b, h, pos) = dot_seq over the hidden
/// outputs of layer_grad_row(b, pos) and o_proj's columns of head h (layer_backward_math.h).
///
/// `project`, when given, computes the projections instead of the CPU's tiles (a device
/// backend's AttentionBackend::project_heads, which keeps every output's one fma chain): the
/// tasks run one at a time and hand it every head's job of 512 rows at once.
using LayerProjector = std::function<void(std::span<const ProjectionJob>, int dim, int outputs)>;
Shard layer_shard(const Problem& problem, TensorId tensor, const ShardShape& shape,
                  InputPrecision precision, ThreadPool& pool, const LayerProjector& project = {});

/// q or k rows (tensor q or k) before the head norm: the projection and its bias, FP32 — the
/// norm's backward reads them.
Shard layer_pre_norm(const Problem& problem, TensorId tensor, const ShardShape& shape,
                     ThreadPool& pool);

}  // namespace cpd
