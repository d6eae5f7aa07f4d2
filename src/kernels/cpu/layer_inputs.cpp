#include "kernels/cpu/layer_inputs.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "core/attention_jobs.h"
#include "cpdrift/bf16.h"
#include "cpdrift/layer_math.h"
#include "cpdrift/rope.h"
#include "kernels/cpu/projection.h"
#include "kernels/layer_weights.h"

namespace cpd {
namespace {

// A task's positions: its hidden rows are generated once and projected for every head. A
// device's projection takes larger tasks (fewer calls, each its weights' upload).
constexpr std::int64_t kRowsPerTask = 32, kRowsPerDeviceTask = 512;

struct HeadWeights {
  const float* w;     // [D][hidden]
  const float* bias;  // [D] or null
};

// q, k, v through their last step, or (`pre_norm`) only the projection and its bias; dO.
Shard project_shard(const Problem& problem, TensorId tensor, const ShardShape& shape,
                    InputPrecision precision, ThreadPool& pool, bool pre_norm,
                    const LayerProjector& project) {
  const std::int64_t rows_per_task = project ? kRowsPerDeviceTask : kRowsPerTask;
  const Problem made = with_layer_weights(problem);  // shares the run's weights when it has them
  const LayerWeights& weights = *made.weights;
  const ModelDims& dims = problem.dims;
  const int d = dims.head_dim, hidden = dims.hidden_size, half = dims.rotary_dim / 2;
  const bool grad = tensor == TensorId::d_out;
  const bool rotate = problem.rope && !pre_norm && (tensor == TensorId::q || tensor == TensorId::k);
  const bool round = precision == InputPrecision::bf16;
  const float* norm = grad || pre_norm ? nullptr : weights.norm(tensor);
  const auto eps = static_cast<float>(dims.rms_norm_eps);
  const std::vector<float> inv_freq = rope_inv_freq(dims);
  std::vector<HeadWeights> heads;  // looked up here: the weights are made under a lock
  for (std::int64_t h = shape.heads.begin; h < shape.heads.end; ++h) {
    if (grad) {  // o_proj's columns of head h, transposed: [D][hidden]
      const std::int64_t gs = dims.group_size();
      heads.push_back(HeadWeights{
          weights.o_proj_group_transposed(h / gs) + (h % gs) * d * std::int64_t{hidden}, nullptr});
    } else {
      heads.push_back(HeadWeights{weights.projection(tensor, h), weights.bias(tensor, h)});
    }
  }

  struct Task {
    std::int64_t pos, count, local_row;
  };
  std::vector<Task> tasks;
  std::int64_t local = 0;
  for (const Range& r : shape.tokens) {
    for (std::int64_t p = r.begin; p < r.end; p += rows_per_task)
      tasks.push_back(Task{p, std::min(rows_per_task, r.end - p), local + (p - r.begin)});
    local += r.size();
  }
  Shard shard(shape, Uninitialized{});  // the tasks write every row
  const auto run_task = [&](std::int64_t t) {
    const Task& task = tasks[static_cast<std::size_t>(t / shape.batch)];
    const int b = static_cast<int>(t % shape.batch);
    std::vector<float> x(static_cast<std::size_t>(task.count * hidden));
    std::vector<float> y(heads.size() * static_cast<std::size_t>(task.count * d));
    std::vector<float> cos_row(static_cast<std::size_t>(half)), sin_row(cos_row.size());
    if (grad) {
      for (std::int64_t i = 0; i < task.count; ++i)
        layer_grad_row(problem, b, task.pos + i, x.data() + i * hidden);
    } else {
      layer_hidden_rows(problem, b, Range{task.pos, task.pos + task.count}, x.data());
    }
    std::vector<ProjectionJob> jobs;
    for (std::size_t k = 0; k < heads.size(); ++k)
      jobs.push_back(ProjectionJob{x.data(), task.count, heads[k].w, hidden,
                                   y.data() + k * static_cast<std::size_t>(task.count * d)});
    if (project) {
      project(jobs, hidden, d);
    } else {
      for (const ProjectionJob& job : jobs) project_rows(job, hidden, d);
    }
    for (std::size_t k = 0; k < heads.size(); ++k) {
      for (std::int64_t i = 0; i < task.count; ++i) {
        float* row =
            shard.at(b, shape.heads.begin + static_cast<std::int64_t>(k), task.local_row + i);
        const float* acc = jobs[k].z + i * d;
        for (int e = 0; e < d; ++e) row[e] = heads[k].bias ? acc[e] + heads[k].bias[e] : acc[e];
        if (norm) head_rms_norm(row, norm, d, eps, row);
        if (rotate) {
          const std::int64_t at = layer_rope_position(problem, b, task.pos + i);
          for (int f = 0; f < half; ++f) rope_cos_sin(at, inv_freq[f], cos_row[f], sin_row[f]);
          rope_rotate_row(row, cos_row.data(), sin_row.data(), half);
        }
        if (round) {
          for (int e = 0; e < d; ++e) row[e] = round_bf16(row[e]);
        }
      }
    }
  };
  const auto count = static_cast<std::int64_t>(tasks.size()) * shape.batch;
  if (project) {  // a device's projection: one call at a time, the tasks in order
    for (std::int64_t t = 0; t < count; ++t) run_task(t);
  } else {
    pool.parallel_for(count, run_task);
  }
  return shard;
}

}  // namespace

Shard layer_shard(const Problem& problem, TensorId tensor, const ShardShape& shape,
                  InputPrecision precision, ThreadPool& pool, const LayerProjector& project) {
  return project_shard(problem, tensor, shape, precision, pool, false, project);
}

Shard layer_pre_norm(const Problem& problem, TensorId tensor, const ShardShape& shape,
                     ThreadPool& pool) {
  return project_shard(problem, tensor, shape, InputPrecision::fp32, pool, true, {});
}

}  // namespace cpd
