// The lm_head projection tile (include/cpdrift/cpu/projection.h).
#include <algorithm>
#include <vector>

#include "cpdrift/cpu/projection.h"
#include "tile_kernels.h"

namespace cpd {
namespace {

using simd::F16;

// Logits of the tile's rows (transposed in ht, `n` of them valid) for vocabulary rows
// [v, v + kVocab) of w: acc = fma(h[d], w[d], acc) from +0 over d ascending, per lane.
template <int kVocab>
void project_block(const float* ht, int n, const float* w, std::int64_t ldw, std::int64_t v,
                   int dim, int vocab, float* z) {
  F16 acc[kVocab];
  const float* wv[kVocab];
  for (int x = 0; x < kVocab; ++x) {
    acc[x] = simd::splat(0.0f);
    wv[x] = w + (v + x) * ldw;
  }
  for (int d = 0; d < dim; ++d) {
    const F16 hd = simd::load(ht + d * kTileRows);
    for (int x = 0; x < kVocab; ++x) acc[x] = simd::fma(hd, simd::splat(wv[x][d]), acc[x]);
  }
  alignas(64) float lanes[kVocab][kTileRows];
  for (int x = 0; x < kVocab; ++x) simd::store(lanes[x], acc[x]);
  for (int r = 0; r < n; ++r) {
    for (int x = 0; x < kVocab; ++x) z[r * std::int64_t{vocab} + v + x] = lanes[x][r];
  }
}

// Vocabulary rows per pass over d: their accumulators and the hidden column fill the vector
// registers (six F16 pairs and the operands on AVX2's sixteen, eight on AVX-512's 32).
#if defined(CPD_SIMD16_AVX512)
constexpr int kVocabStep = 8;
#else
constexpr int kVocabStep = 6;
#endif

// Vocabulary rows a work item covers (a multiple of either step): their columns of w (96 rows
// of the head's D floats, 48 KiB at D = 128) stay in cache while every row tile of the job
// passes over them.
constexpr std::int64_t kVocabBlock = 96;

// Vocabulary rows [v0, v1) for every row of the job, a row tile at a time.
void project_vocab_block(const ProjectionJob& j, std::int64_t v0, std::int64_t v1, int dim,
                         int vocab, float* ht) {
  for (std::int64_t r0 = 0; r0 < j.rows; r0 += kTileRows) {
    const int n = static_cast<int>(std::min<std::int64_t>(kTileRows, j.rows - r0));
    tile::transpose(j.hidden + r0 * dim, n, dim, ht);
    float* z = j.z + r0 * vocab;
    std::int64_t v = v0;
    for (; v + kVocabStep <= v1; v += kVocabStep)
      project_block<kVocabStep>(ht, n, j.w, j.ldw, v, dim, vocab, z);
    for (; v < v1; ++v) project_block<1>(ht, n, j.w, j.ldw, v, dim, vocab, z);
  }
}

std::int64_t blocks_of(int vocab) { return (vocab + kVocabBlock - 1) / kVocabBlock; }

}  // namespace

void project_rows(const ProjectionJob& job, int dim, int vocab) {
  std::vector<float> ht(static_cast<std::size_t>(dim) * kTileRows);
  for (std::int64_t b = 0; b < blocks_of(vocab); ++b) {
    project_vocab_block(job, b * kVocabBlock, std::min<std::int64_t>(vocab, (b + 1) * kVocabBlock),
                        dim, vocab, ht.data());
  }
}

void run_projection_jobs(std::span<const ProjectionJob> jobs, int dim, int vocab,
                         ThreadPool& pool) {
  // One work item per (job, vocabulary block).
  const std::int64_t blocks = blocks_of(vocab);
  pool.parallel_for(static_cast<std::int64_t>(jobs.size()) * blocks, [&](std::int64_t item) {
    thread_local std::vector<float> ht;
    ht.resize(static_cast<std::size_t>(dim) * kTileRows);
    const std::int64_t b = item % blocks;
    project_vocab_block(jobs[static_cast<std::size_t>(item / blocks)], b * kVocabBlock,
                        std::min<std::int64_t>(vocab, (b + 1) * kVocabBlock), dim, vocab,
                        ht.data());
  });
}

}  // namespace cpd
