#include "kernels/cpu/token_sums.h"

#include <algorithm>
#include <vector>

#include "cpdrift/layer_math.h"
#include "kernels/cpu/simd16.h"

namespace cpd {
namespace {

constexpr int kLanes = 16;  // an F16
constexpr int kTileOutputs = 4;
constexpr int kTileLanes = 2 * kLanes;

// Outputs [o0, o0 + n) (n ≤ kTileOutputs), inputs [i0, i0 + kTileLanes) over every block.
void full_tile(const TokenSumJob& j, int o0, int n, int i0) {
  for (std::size_t b = 0; b < j.blocks.size(); ++b) {
    const TokenBlock& block = j.blocks[b];
    simd::F16 acc[kTileOutputs][2];
    for (auto& row : acc) row[0] = row[1] = simd::splat(0.0f);
    for (std::int64_t t = 0; t < block.rows; ++t) {
      const float* x = block.x + t * j.ld_x + i0;
      const simd::F16 x0 = simd::in_register(simd::load(x));
      const simd::F16 x1 = simd::in_register(simd::load(x + kLanes));
      const float* dy = block.dy + t * j.ld_dy + o0;
      for (int r = 0; r < n; ++r) {
        const simd::F16 a = simd::splat(dy[r]);
        acc[r][0] = simd::fma(a, x0, acc[r][0]);
        acc[r][1] = simd::fma(a, x1, acc[r][1]);
      }
    }
    const bool store = b == 0 && !j.continues;
    for (int r = 0; r < n; ++r) {
      float* sum = j.sum + (o0 + r) * j.ld_sum + i0;
      for (int h = 0; h < 2; ++h) {
        float* s = sum + h * kLanes;
        simd::store(s, store ? acc[r][h] : simd::add(simd::load(s), acc[r][h]));
      }
    }
  }
}

// The inputs past the last full tile, element by element.
void tail(const TokenSumJob& j, int o0, int n, int i0) {
  for (int o = o0; o < o0 + n; ++o) {
    for (int i = i0; i < j.inputs; ++i) {
      float& s = j.sum[o * j.ld_sum + i];
      for (std::size_t b = 0; b < j.blocks.size(); ++b) {
        const TokenBlock& block = j.blocks[b];
        float acc = 0.0f;
        for (std::int64_t t = 0; t < block.rows; ++t)
          acc = fma_f32(block.dy[t * j.ld_dy + o], block.x[t * j.ld_x + i], acc);
        s = b == 0 && !j.continues ? acc : s + acc;
      }
    }
  }
}

}  // namespace

void run_token_sum_jobs(std::span<const TokenSumJob> jobs, ThreadPool& pool) {
  struct Task {
    const TokenSumJob* job;
    int o0;
  };
  std::vector<Task> tasks;
  for (const TokenSumJob& j : jobs) {
    for (int o = 0; o < j.outputs; o += kTileOutputs) tasks.push_back(Task{&j, o});
  }
  pool.parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t k) {
    const Task& task = tasks[static_cast<std::size_t>(k)];
    const TokenSumJob& j = *task.job;
    const int n = std::min(kTileOutputs, j.outputs - task.o0);
    const int full = j.inputs / kTileLanes * kTileLanes;
    for (int i = 0; i < full; i += kTileLanes) full_tile(j, task.o0, n, i);
    tail(j, task.o0, n, full);
  });
}

void token_sums_reference(const TokenSumJob& j) {
  std::vector<float> p(static_cast<std::size_t>(j.outputs) * j.inputs);
  for (std::size_t b = 0; b < j.blocks.size(); ++b) {
    const TokenBlock& block = j.blocks[b];
    token_block_partial(block.dy, j.ld_dy, block.x, j.ld_x, block.rows, j.outputs, j.inputs,
                        p.data());
    for (int o = 0; o < j.outputs; ++o) {
      fold_token_block(p.data() + static_cast<std::ptrdiff_t>(o) * j.inputs, j.inputs,
                       b == 0 && !j.continues, j.sum + o * j.ld_sum);
    }
  }
}

}  // namespace cpd
