#include "cli/bench_layer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cli/kernel_timing.h"
#include "core/attention_jobs.h"
#include "cpdrift/layer_math.h"
#include "kernels/cpu/projection.h"
#include "kernels/cpu/token_sums.h"
#include "kernels/layer_weights.h"

namespace cpd {
namespace {

using namespace kernel_timing;

// Rows checked against the definition: every 97th token (the tile's edges and interiors alike).
constexpr std::int64_t kSampleStride = 97;

void print_projection(const char* name, const std::vector<double>& times, double flops, double peak,
                      bool same) {
  const double rate = flops / times.front();
  std::printf("  %-26s %10.3f %10.3f %12.1f %8.0f%%   bits %s definition\n", name, times.front(),
              times[times.size() / 2], rate * 1e-9, 100.0 * rate / peak, same ? "==" : "!=");
  std::fflush(stdout);
}

// q_proj's weight gradient: the token sums of the q rows (standing for dP, [head][S][D]) against
// the hidden rows `x` over the token blocks in order, a job per head as the backward runs them.
void bench_token_sums(const Problem& p, const std::vector<float>& q, const std::vector<float>& x,
                      int repeats, double peak, ThreadPool& pool) {
  const ModelDims& d = p.dims;
  const std::int64_t s = p.seq_len, hidden = d.hidden_size, dim = d.head_dim;
  const std::int64_t width = std::int64_t{d.num_q_heads} * dim;
  const std::int64_t bt = layer_token_block(s);
  std::vector<float> dw(static_cast<std::size_t>(width * hidden));
  std::vector<TokenSumJob> jobs;
  for (std::int64_t h = 0; h < d.num_q_heads; ++h) {
    TokenSumJob job;
    for (std::int64_t t = 0; bt > 0 && t < s; t += bt)
      job.blocks.push_back(TokenBlock{q.data() + (h * s + t) * dim, x.data() + t * hidden, bt});
    job.ld_dy = dim;
    job.ld_x = job.ld_sum = hidden;
    job.outputs = static_cast<int>(dim);
    job.inputs = static_cast<int>(hidden);
    job.sum = dw.data() + h * dim * hidden;
    jobs.push_back(std::move(job));
  }
  const std::vector<double> dw_times = times_of(repeats, [&] {
    const auto t = Clock::now();
    run_token_sum_jobs(jobs, pool);
    return seconds_since(t);
  });
  bool same = true;
  for (std::int64_t h = 0; h < d.num_q_heads; h += 7) {  // four rows of every 7th head
    TokenSumJob job = jobs[static_cast<std::size_t>(h)];
    job.outputs = 4;
    std::vector<float> defined(static_cast<std::size_t>(4 * hidden));
    job.sum = defined.data();
    token_sums_reference(job);
    same = same && std::memcmp(defined.data(), dw.data() + h * dim * hidden,
                               defined.size() * sizeof(float)) == 0;
  }
  print_projection("q_proj dW (token sums)", dw_times, 2.0 * s * width * hidden, peak, same);
}

}  // namespace

void bench_layer_projections(const Problem& problem, int repeats, double peak, ThreadPool& pool) {
  Problem p = problem;
  p.layer = true;
  const ModelDims& d = p.dims;
  const std::int64_t s = p.seq_len, hidden = d.hidden_size, dim = d.head_dim;
  const std::int64_t width = std::int64_t{d.num_q_heads} * dim, group = d.group_size() * dim;
  const LayerWeights w(d, p.seed);
  std::vector<float> x(static_cast<std::size_t>(s * hidden));
  for (std::int64_t t = 0; t < s; ++t) layer_hidden_row(p, 0, t, x.data() + t * hidden);
  std::printf("# the layer's projections, S=%lld tokens, hidden %lld (one chain per output)\n",
              static_cast<long long>(s), static_cast<long long>(hidden));

  // q_proj: every query head's D outputs of every token, [head][S][D], as the run projects q
  // (layer_inputs.cpp): tasks of kRowsPerTask tokens over the pool, each through every head.
  constexpr std::int64_t kRowsPerTask = 32;
  std::vector<float> q(static_cast<std::size_t>(s * width));
  const auto timed = [&](auto&& run) {
    return times_of(repeats, [&] {
      const auto t = Clock::now();
      run();
      return seconds_since(t);
    });
  };
  const std::vector<double> q_times = timed([&] {
    pool.parallel_for((s + kRowsPerTask - 1) / kRowsPerTask, [&](std::int64_t task) {
      const std::int64_t t0 = task * kRowsPerTask, rows = std::min(kRowsPerTask, s - t0);
      std::vector<float> z(static_cast<std::size_t>(rows * dim));
      for (std::int64_t h = 0; h < d.num_q_heads; ++h) {
        project_rows(ProjectionJob{x.data() + t0 * hidden, rows, w.projection(TensorId::q, h),
                                   hidden, z.data()},
                     static_cast<int>(hidden), static_cast<int>(dim));
        std::memcpy(q.data() + (h * s + t0) * dim, z.data(), z.size() * sizeof(float));
      }
    });
  });
  bool same = true;
  std::vector<float> y(static_cast<std::size_t>(std::max(dim, hidden)));
  for (std::int64_t t = 0; t < s; t += kSampleStride) {
    for (std::int64_t h = 0; h < d.num_q_heads; ++h) {
      project_row(x.data() + t * hidden, w.projection(TensorId::q, h), hidden,
                  static_cast<int>(hidden), static_cast<int>(dim), nullptr, y.data());
      same = same && std::memcmp(y.data(), q.data() + (h * s + t) * dim, dim * sizeof(float)) == 0;
    }
  }
  print_projection("q_proj (fp32, 32-row tasks)", q_times, 2.0 * s * hidden * width, peak, same);

  // o_proj: the q rows stand for the attention output, regrouped [group][S][G], every group
  // folded in ascending order into [S][hidden].
  std::vector<float> a(static_cast<std::size_t>(s * width)),
      out(static_cast<std::size_t>(s * hidden));
  for (std::int64_t g = 0; g < d.num_kv_heads; ++g) {
    for (std::int64_t t = 0; t < s; ++t) {
      for (int j = 0; j < d.group_size(); ++j) {
        std::memcpy(a.data() + (g * s + t) * group + j * dim,
                    q.data() + ((g * d.group_size() + j) * s + t) * dim, dim * sizeof(float));
      }
    }
  }
  FoldedProjectionJob fold{{}, out.data(), false};
  for (std::int64_t g = 0; g < d.num_kv_heads; ++g)
    fold.heads.push_back(
        ProjectionJob{a.data() + g * s * group, s, w.o_proj_group(g), group, nullptr});
  const std::vector<double> o_times = timed([&] {
    run_folded_projection_jobs({&fold, 1}, static_cast<int>(group), static_cast<int>(hidden), pool);
  });
  // The definition reads W_o [hidden][Hq·D] whole and one token's heads side by side.
  std::vector<float> w_o(static_cast<std::size_t>(hidden * width)),
      row(static_cast<std::size_t>(width));
  for (std::int64_t g = 0; g < d.num_kv_heads; ++g) {
    for (std::int64_t o = 0; o < hidden; ++o)
      std::memcpy(w_o.data() + o * width + g * group, w.o_proj_group(g) + o * group,
                  group * sizeof(float));
  }
  same = true;
  for (std::int64_t t = 0; t < s; t += kSampleStride) {
    for (std::int64_t g = 0; g < d.num_kv_heads; ++g)
      std::memcpy(row.data() + g * group, a.data() + (g * s + t) * group, group * sizeof(float));
    o_proj_groups(row.data(), w_o.data(), width, static_cast<int>(group), 0, d.num_kv_heads,
                  static_cast<int>(hidden), true, y.data());
    same = same && std::memcmp(y.data(), out.data() + t * hidden, hidden * sizeof(float)) == 0;
  }
  print_projection("o_proj (fp32, group fold)", o_times, 2.0 * s * width * hidden, peak, same);
  bench_token_sums(p, q, x, repeats, peak, pool);
}

}  // namespace cpd
