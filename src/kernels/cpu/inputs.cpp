#include "kernels/cpu/inputs.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cpdrift/bf16.h"
#include "cpdrift/input_shape.h"
#include "cpdrift/rope.h"
#include "kernels/cpu/layer_inputs.h"
#include "kernels/cpu/normals.h"

namespace cpd {

namespace {

// One task per (token range, block of rows): the row's RoPE cos/sin are computed once and
// shared by every head and batch entry of the shard.
constexpr std::int64_t kRowsPerTask = 32;

// Inputs from a file: each (b, h) row run read as it is stored, RoPE at the file's positions
// when the file holds q and k before RoPE, then the precision's rounding.
Shard read_shard(const Problem& problem, TensorId tensor, const ShardShape& shape,
                 InputPrecision precision, ThreadPool& pool) {
  const InputSource& source = *problem.inputs;
  const ModelDims& dims = problem.dims;
  const int d = dims.head_dim, half = dims.rotary_dim / 2;
  const bool rotate = problem.rope && !source.info().rope_applied &&
                      (tensor == TensorId::q || tensor == TensorId::k);
  const bool round = precision == InputPrecision::bf16;
  const std::vector<float> inv_freq = rope_inv_freq(dims);
  struct Task {
    int b;
    std::int64_t h;
    Range tokens;
    std::int64_t local_row;
  };
  std::vector<Task> tasks;
  for (int b = 0; b < shape.batch; ++b) {
    for (std::int64_t h = shape.heads.begin; h < shape.heads.end; ++h) {
      std::int64_t local = 0;
      for (const Range& r : shape.tokens) {
        for (std::int64_t p = r.begin; p < r.end; p += kRowsPerTask) {
          tasks.push_back(
              Task{b, h, Range{p, std::min(r.end, p + kRowsPerTask)}, local + (p - r.begin)});
        }
        local += r.size();
      }
    }
  }
  Shard shard(shape, Uninitialized{});  // the tasks write every row
  pool.parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t t) {
    const Task& task = tasks[static_cast<std::size_t>(t)];
    float* rows = shard.at(task.b, task.h, task.local_row);
    source.read_rows(tensor, task.b, task.h, task.tokens, rows);
    std::vector<float> cos_row(static_cast<std::size_t>(half)), sin_row(cos_row.size());
    for (std::int64_t i = 0; i < task.tokens.size(); ++i) {
      float* row = rows + i * d;
      if (rotate) {
        const std::int64_t pos = source.rope_position(task.b, task.tokens.begin + i);
        for (int f = 0; f < half; ++f) rope_cos_sin(pos, inv_freq[f], cos_row[f], sin_row[f]);
        rope_rotate_row(row, cos_row.data(), sin_row.data(), half);
      }
      if (round) {
        for (int e = 0; e < d; ++e) row[e] = round_bf16(row[e]);
      }
    }
  });
  return shard;
}

}  // namespace

Shard generate_shard(const Problem& problem, TensorId tensor, const ShardShape& shape,
                     InputPrecision precision, ThreadPool& pool) {
  const ModelDims& dims = problem.dims;
  const int d = dims.head_dim;
  if (shape.width != d) throw std::invalid_argument("generate_shard: width must be head_dim");
  if (d % 4 != 0) throw std::invalid_argument("generate_shard: head_dim must be a multiple of 4");
  if (tensor == TensorId::lm_head)
    throw std::invalid_argument("generate_shard: lm_head is not a [B, H, S, D] tensor");
  if (problem.layer) return layer_shard(problem, tensor, shape, precision, pool);
  if (problem.inputs && tensor != TensorId::d_out)
    return read_shard(problem, tensor, shape, precision, pool);
  const bool rotate = problem.rope && (tensor == TensorId::q || tensor == TensorId::k);
  const bool round = precision == InputPrecision::bf16;
  const bool shaped = problem.distribution != InputDistribution::gaussian &&
                      (tensor == TensorId::q || tensor == TensorId::k);
  const std::vector<float> inv_freq = rope_inv_freq(dims);
  const int half = dims.rotary_dim / 2;
  const std::int64_t num_heads = heads_of(dims, tensor), seq = problem.seq_len;
  const std::int64_t prompt = shared_prompt_len(problem);
  // The qkv bias of each of the shard's heads (input_shape.h's bias_of), [heads][d].
  const bool biased = dims.qkv_bias && tensor != TensorId::d_out;
  std::vector<float> bias(biased ? static_cast<std::size_t>(shape.heads.size() * d) : 0);
  for (std::int64_t h = shape.heads.begin; biased && h < shape.heads.end; ++h) {
    normal_blocks(problem.seed, bias_of(tensor), static_cast<std::uint64_t>(h * d) >> 2, d / 4,
                  bias.data() + (h - shape.heads.begin) * d);
  }

  struct Task {
    std::int64_t pos, count, local_row;
  };
  std::vector<Task> tasks;
  std::int64_t local = 0;
  for (const Range& r : shape.tokens) {
    for (std::int64_t p = r.begin; p < r.end; p += kRowsPerTask) {
      const std::int64_t n = std::min(kRowsPerTask, r.end - p);
      tasks.push_back(Task{p, n, local + (p - r.begin)});
    }
    local += r.size();
  }

  Shard shard(shape, Uninitialized{});  // the tasks write every row
  pool.parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t t) {
    const Task& task = tasks[static_cast<std::size_t>(t)];
    std::vector<float> cos_row(static_cast<std::size_t>(half)), sin_row(cos_row.size());
    for (std::int64_t i = 0; i < task.count; ++i) {
      const std::int64_t pos = task.pos + i;
      if (rotate) {
        for (int f = 0; f < half; ++f) rope_cos_sin(pos, inv_freq[f], cos_row[f], sin_row[f]);
      }
      for (int b = 0; b < shape.batch; ++b) {
        for (std::int64_t h = shape.heads.begin; h < shape.heads.end; ++h) {
          float* row = shard.at(b, h, task.local_row + i);
          const std::int64_t src = input_sequence(tensor, b, pos, prompt);
          const std::uint64_t first =
              static_cast<std::uint64_t>(((src * num_heads + h) * seq + pos) * d);
          normal_blocks(problem.seed, tensor, first >> 2, d / 4, row);  // first: a multiple of 4
          if (shaped) {
            const std::int64_t kv_head = tensor == TensorId::q ? h / dims.group_size() : h;
            for (int e = 0; e < d; ++e)
              row[e] = shape_input(problem.distribution, tensor, kv_head, pos, e, d, row[e]);
          }
          if (biased) {
            const float* b_h = bias.data() + (h - shape.heads.begin) * d;
            for (int e = 0; e < d; ++e) row[e] = add_bias(row[e], b_h[e]);
          }
          if (rotate) rope_rotate_row(row, cos_row.data(), sin_row.data(), half);
          if (round) {
            for (int e = 0; e < d; ++e) row[e] = round_bf16(row[e]);
          }
        }
      }
    }
  });
  return shard;
}

std::vector<float> lm_head_columns(const Problem& problem, int vocab, Range columns) {
  const std::int64_t width =
      static_cast<std::int64_t>(problem.dims.num_q_heads) * problem.dims.head_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(width)));
  std::vector<float> w(static_cast<std::size_t>(vocab * columns.size()));
  for (int v = 0; v < vocab; ++v) {
    for (std::int64_t c = columns.begin; c < columns.end; ++c) {
      w[static_cast<std::size_t>(v * columns.size() + (c - columns.begin))] =
          normal_at(problem.seed, TensorId::lm_head, static_cast<std::uint64_t>(v * width + c)) *
          scale;
    }
  }
  return w;
}

std::vector<float> lm_head_plane(const Problem& problem, int vocab, std::int64_t head,
                                 ThreadPool& pool) {
  const int dim = problem.dims.head_dim;
  const std::int64_t width = std::int64_t{problem.dims.num_q_heads} * dim;
  if (dim % 4 != 0) throw std::invalid_argument("lm_head_plane: head_dim must be a multiple of 4");
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(width)));
  std::vector<float> w(static_cast<std::size_t>(vocab) * dim);
  constexpr std::int64_t kRowsPerItem = 64;
  pool.parallel_for((vocab + kRowsPerItem - 1) / kRowsPerItem, [&](std::int64_t item) {
    const std::int64_t end = std::min<std::int64_t>(vocab, (item + 1) * kRowsPerItem);
    for (std::int64_t v = item * kRowsPerItem; v < end; ++v) {
      // width and dim are multiples of 4 (generate_shard's check): a row's elements fill whole
      // Philox blocks, each generated once (normal_at would generate it for every element).
      float* row = w.data() + v * dim;
      const auto first = static_cast<std::uint64_t>(v * width + head * dim);
      normal_blocks(problem.seed, TensorId::lm_head, first >> 2, dim / 4, row);
      for (int e = 0; e < dim; ++e) row[e] *= scale;
    }
  });
  return w;
}

std::vector<float> layer_lm_head_rows(const Problem& problem, Range rows, ThreadPool& pool) {
  const std::int64_t hidden = problem.dims.hidden_size;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hidden)));
  std::vector<float> w(static_cast<std::size_t>(rows.size() * hidden));
  pool.parallel_for(rows.size(), [&](std::int64_t i) {
    float* row = w.data() + i * hidden;  // hidden is a multiple of 4 (LayerWeights checks it)
    normal_blocks(problem.seed, TensorId::lm_head,
                  static_cast<std::uint64_t>((rows.begin + i) * hidden) >> 2, hidden / 4, row);
    for (std::int64_t c = 0; c < hidden; ++c) row[c] *= scale;
  });
  return w;
}

}  // namespace cpd
