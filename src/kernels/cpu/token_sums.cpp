#include "kernels/cpu/token_sums.h"

#include <algorithm>
#include <vector>

#include "cpdrift/layer_math.h"
#include "kernels/cpu/simd16.h"

namespace cpd {
namespace {

constexpr int kLanes = 16;  // an F16
constexpr int kTileOutputs = 8;
constexpr int kTileColumns = 2 * kLanes;
// A task's columns: its x panel of a block (256 rows × 256 columns, 256 KiB) stays in L2 while
// every output tile of the job passes over it.
constexpr int kTaskColumns = 256;

// One block's partials of outputs [o0, o0 + N), columns [i0, i0 + kTileColumns): one fma chain
// from +0 over the block's rows per element, in registers (inlined: `acc` must not live in
// memory, which halves the throughput).
template <int N>
[[gnu::always_inline]] inline void block_partials(const TokenSumJob& j, const TokenBlock& block,
                                                  int o0, int i0, simd::F16 (&acc)[N][2]) {
  for (auto& row : acc) row[0] = row[1] = simd::splat(0.0f);
  for (std::int64_t t = 0; t < block.rows; ++t) {
    const float* x = block.x + t * j.ld_x + i0;
    const simd::F16 x0 = simd::in_register(simd::load(x));
    const simd::F16 x1 = simd::in_register(simd::load(x + kLanes));
    const float* dy = block.dy + t * j.ld_dy + o0;
    for (int r = 0; r < N; ++r) {
      const simd::F16 a = simd::splat(dy[r]);
      acc[r][0] = simd::fma(a, x0, acc[r][0]);
      acc[r][1] = simd::fma(a, x1, acc[r][1]);
    }
  }
}

// Outputs [o0, o0 + N), columns [i0, i0 + kTileColumns) of one block: the block's partials in
// registers over its rows, then stored (`store`) or added to the sums.
template <int N>
void tile(const TokenSumJob& j, const TokenBlock& block, int o0, int i0, bool store) {
  simd::F16 acc[N][2];
  block_partials<N>(j, block, o0, i0, acc);
  for (int r = 0; r < N; ++r) {
    float* sum = j.sum + (o0 + r) * j.ld_sum + i0;
    for (int h = 0; h < 2; ++h) {
      float* s = sum + h * kLanes;
      simd::store(s, store ? acc[r][h] : simd::add(simd::load(s), acc[r][h]));
    }
  }
}

// The same tile over every block at once, for jobs of few rows: the running sums stay in
// registers too (from the sums when the job continues), written once after the last block,
// where the tile above reads and writes them once a block.
template <int N>
void tile_all_blocks(const TokenSumJob& j, int o0, int i0) {
  simd::F16 run[N][2];
  for (int r = 0; r < N; ++r) {
    for (int h = 0; h < 2; ++h)
      run[r][h] = j.continues ? simd::load(j.sum + (o0 + r) * j.ld_sum + i0 + h * kLanes)
                              : simd::splat(0.0f);  // replaced by the first block's partials
  }
  for (std::size_t b = 0; b < j.blocks.size(); ++b) {
    const TokenBlock& block = j.blocks[b];
    simd::F16 acc[N][2];
    block_partials<N>(j, block, o0, i0, acc);
    const bool first = b == 0 && !j.continues;
    for (int r = 0; r < N; ++r) {
      for (int h = 0; h < 2; ++h) run[r][h] = first ? acc[r][h] : simd::add(run[r][h], acc[r][h]);
    }
  }
  for (int r = 0; r < N; ++r) {
    for (int h = 0; h < 2; ++h)
      simd::store(j.sum + (o0 + r) * j.ld_sum + i0 + h * kLanes, run[r][h]);
  }
}

// Columns [i0, i1) of every output of one block, element by element (past the last full tile).
void tail(const TokenSumJob& j, const TokenBlock& block, int i0, int i1, bool store) {
  for (int o = 0; o < j.outputs; ++o) {
    for (int i = i0; i < i1; ++i) {
      float acc = 0.0f;
      for (std::int64_t t = 0; t < block.rows; ++t)
        acc = fma_f32(block.dy[t * j.ld_dy + o], block.x[t * j.ld_x + i], acc);
      float& s = j.sum[o * j.ld_sum + i];
      s = store ? acc : s + acc;
    }
  }
}

// Columns [i0, i1) of a job: block by block in order, every output over them; for a job whose
// rows' x over a tile's columns fit in L1 (kFewRows), every block at once.
constexpr std::int64_t kFewRows = 128;
void columns(const TokenSumJob& j, int i0, int i1) {
  const int full = i0 + (i1 - i0) / kTileColumns * kTileColumns;
  std::int64_t rows = 0;
  for (const TokenBlock& b : j.blocks) rows += b.rows;
  if (rows <= kFewRows && !j.blocks.empty()) {
    int o = 0;
    for (; o + kTileOutputs <= j.outputs; o += kTileOutputs) {
      for (int i = i0; i < full; i += kTileColumns) tile_all_blocks<kTileOutputs>(j, o, i);
    }
    for (; o < j.outputs; ++o) {
      for (int i = i0; i < full; i += kTileColumns) tile_all_blocks<1>(j, o, i);
    }
    for (std::size_t b = 0; b < j.blocks.size(); ++b)
      tail(j, j.blocks[b], full, i1, b == 0 && !j.continues);
    return;
  }
  for (std::size_t b = 0; b < j.blocks.size(); ++b) {
    const TokenBlock& block = j.blocks[b];
    const bool store = b == 0 && !j.continues;
    int o = 0;
    for (; o + kTileOutputs <= j.outputs; o += kTileOutputs) {
      for (int i = i0; i < full; i += kTileColumns) tile<kTileOutputs>(j, block, o, i, store);
    }
    for (; o < j.outputs; ++o) {
      for (int i = i0; i < full; i += kTileColumns) tile<1>(j, block, o, i, store);
    }
    tail(j, block, full, i1, store);
  }
}

}  // namespace

void run_token_sum_jobs(std::span<const TokenSumJob> jobs, ThreadPool& pool) {
  struct Task {
    const TokenSumJob* job;
    int i0, i1;
  };
  std::vector<Task> tasks;
  for (const TokenSumJob& j : jobs) {
    for (int i = 0; i < j.inputs; i += kTaskColumns)
      tasks.push_back(Task{&j, i, std::min(j.inputs, i + kTaskColumns)});
  }
  pool.parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t k) {
    const Task& task = tasks[static_cast<std::size_t>(k)];
    columns(*task.job, task.i0, task.i1);
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
