// The lm_head projection tile (include/cpdrift/cpu/projection.h).
#include <algorithm>
#include <vector>

#include "cpdrift/cpu/projection.h"
#include "tile_kernels.h"

namespace cpd {
namespace {

using simd::F16;

// A register block: kTiles row tiles (16 rows each, one SIMD lane a row) × kVocabStep
// vocabulary rows. Per d: kTiles loads of hidden columns and kVocabStep broadcasts of w for
// kTiles × kVocabStep fmas (2 + 8 for 16 on AVX-512, where twelve rows of w ran out of
// general registers for their pointers; AVX2's F16 is two of its 16 registers: 12 + 2).
#if defined(CPD_SIMD16_AVX512)
constexpr int kTiles = 2, kVocabStep = 8;
#else
constexpr int kTiles = 1, kVocabStep = 6;
#endif

// Vocabulary rows a work item covers (a multiple of either step): their rows of w (96 × D
// floats, 48 KiB at D = 128) stay in cache while every row tile of the job passes over them.
constexpr std::int64_t kVocabBlock = 96;

// Logits of T row tiles (transposed in ht, [tile][d][16], `n` rows valid in all) for
// vocabulary rows [v, v + V) of w: acc = fma(h[d], w[d], acc) from +0 over d ascending, per
// lane, so the bits are head_partial_logits's. Stored into z, or with `fold` added to what z
// holds (z = z + acc, one step of fold_head_logits).
template <int T, int V>
void project_block(const float* ht, int n, const float* w, std::int64_t ldw, std::int64_t v,
                   int dim, int vocab, bool fold, float* z) {
  F16 acc[T][V];
  const float* wv[V];
  for (int x = 0; x < V; ++x) {
    for (int t = 0; t < T; ++t) acc[t][x] = simd::splat(0.0f);
    wv[x] = w + (v + x) * ldw;
  }
  const std::int64_t tile = std::int64_t{dim} * kTileRows;
  for (int d = 0; d < dim; ++d) {
    F16 hd[T];
    for (int t = 0; t < T; ++t) hd[t] = simd::load(ht + t * tile + d * kTileRows);
    for (int x = 0; x < V; ++x) {
      const F16 wx = simd::splat(wv[x][d]);
      for (int t = 0; t < T; ++t) acc[t][x] = simd::fma(hd[t], wx, acc[t][x]);
    }
  }
  for (int t = 0; t < T; ++t) {
    alignas(64) float lanes[V][kTileRows];
    for (int x = 0; x < V; ++x) simd::store(lanes[x], acc[t][x]);
    for (int r = 0; r < std::min(kTileRows, n - t * kTileRows); ++r) {
      float* out = z + (t * kTileRows + r) * std::int64_t{vocab} + v;
      if (fold) {
        for (int x = 0; x < V; ++x) out[x] = out[x] + lanes[x][r];
      } else {
        for (int x = 0; x < V; ++x) out[x] = lanes[x][r];
      }
    }
  }
}

// Vocabulary rows [v0, v1) for T row tiles (transposed in ht) holding n rows.
template <int T>
void project_tiles(const float* ht, int n, const ProjectionJob& j, std::int64_t v0, std::int64_t v1,
                   int dim, int vocab, bool fold, float* z) {
  std::int64_t v = v0;
  for (; v + kVocabStep <= v1; v += kVocabStep)
    project_block<T, kVocabStep>(ht, n, j.w, j.ldw, v, dim, vocab, fold, z);
  for (; v < v1; ++v) project_block<T, 1>(ht, n, j.w, j.ldw, v, dim, vocab, fold, z);
}

// Vocabulary rows [v0, v1) for every row of the job (transposed in ht, a tile after another),
// into z ([rows][vocab]), or added to it with `fold`.
void project_vocab_block(const ProjectionJob& j, const float* ht, std::int64_t v0, std::int64_t v1,
                         int dim, int vocab, bool fold, float* z) {
  const std::int64_t tile = std::int64_t{dim} * kTileRows;
  std::int64_t r = 0;
  for (; r + kTiles * kTileRows <= j.rows; r += kTiles * kTileRows) {
    project_tiles<kTiles>(ht + r / kTileRows * tile, kTiles * kTileRows, j, v0, v1, dim, vocab,
                          fold, z + r * vocab);
  }
  for (; r < j.rows; r += kTileRows) {
    const int n = static_cast<int>(std::min<std::int64_t>(kTileRows, j.rows - r));
    project_tiles<1>(ht + r / kTileRows * tile, n, j, v0, v1, dim, vocab, fold, z + r * vocab);
  }
}

std::int64_t vocab_end(std::int64_t block, int vocab) {
  return std::min<std::int64_t>(vocab, (block + 1) * kVocabBlock);
}

std::int64_t blocks_of(int vocab) { return (vocab + kVocabBlock - 1) / kVocabBlock; }

// The job's hidden rows, transposed a tile at a time ([tile][d][16], lanes past the rows zero).
void transpose_rows(const ProjectionJob& j, int dim, std::vector<float>& ht) {
  const std::int64_t tiles = (j.rows + kTileRows - 1) / kTileRows,
                     tile = std::int64_t{dim} * kTileRows;
  ht.resize(static_cast<std::size_t>(tiles * tile));
  for (std::int64_t t = 0; t < tiles; ++t) {
    const int n = static_cast<int>(std::min<std::int64_t>(kTileRows, j.rows - t * kTileRows));
    tile::transpose(j.hidden + t * kTileRows * dim, n, dim, ht.data() + t * tile);
  }
}

}  // namespace

void project_rows(const ProjectionJob& job, int dim, int vocab) {
  std::vector<float> ht;
  transpose_rows(job, dim, ht);
  for (std::int64_t b = 0; b < blocks_of(vocab); ++b)
    project_vocab_block(job, ht.data(), b * kVocabBlock, vocab_end(b, vocab), dim, vocab, false,
                        job.z);
}

void run_projection_jobs(std::span<const ProjectionJob> jobs, int dim, int vocab,
                         ThreadPool& pool) {
  // Each job's rows transposed once, then one work item per (job, vocabulary block).
  std::vector<std::vector<float>> ht(jobs.size());
  pool.parallel_for(static_cast<std::int64_t>(jobs.size()), [&](std::int64_t i) {
    transpose_rows(jobs[static_cast<std::size_t>(i)], dim, ht[static_cast<std::size_t>(i)]);
  });
  const std::int64_t blocks = blocks_of(vocab);
  pool.parallel_for(static_cast<std::int64_t>(jobs.size()) * blocks, [&](std::int64_t item) {
    const auto i = static_cast<std::size_t>(item / blocks);
    const std::int64_t b = item % blocks;
    project_vocab_block(jobs[i], ht[i].data(), b * kVocabBlock, vocab_end(b, vocab), dim, vocab,
                        false, jobs[i].z);
  });
}

void run_folded_projection_jobs(std::span<const FoldedProjectionJob> jobs, int dim, int vocab,
                                ThreadPool& pool) {
  // Every head's rows transposed once; then per (job, vocabulary block) the heads in order,
  // each adding its partials to the block's logits while they are in cache.
  std::vector<const ProjectionJob*> heads;
  std::vector<std::size_t> first_head;  // per job, its first head's index in `heads`
  for (const FoldedProjectionJob& j : jobs) {
    first_head.push_back(heads.size());
    for (const ProjectionJob& h : j.heads) heads.push_back(&h);
  }
  std::vector<std::vector<float>> ht(heads.size());
  pool.parallel_for(static_cast<std::int64_t>(heads.size()), [&](std::int64_t i) {
    transpose_rows(*heads[static_cast<std::size_t>(i)], dim, ht[static_cast<std::size_t>(i)]);
  });
  const std::int64_t blocks = blocks_of(vocab);
  pool.parallel_for(static_cast<std::int64_t>(jobs.size()) * blocks, [&](std::int64_t item) {
    const auto i = static_cast<std::size_t>(item / blocks);
    const std::int64_t b = item % blocks;
    const FoldedProjectionJob& j = jobs[i];
    for (std::size_t h = 0; h < j.heads.size(); ++h) {
      project_vocab_block(j.heads[h], ht[first_head[i] + h].data(), b * kVocabBlock,
                          vocab_end(b, vocab), dim, vocab, h > 0 || j.continues, j.logits);
    }
  });
}

}  // namespace cpd
