// The lm_head projection tile (src/kernels/cpu/projection.h).
#include <algorithm>
#include <vector>

#include "kernels/cpu/projection.h"
#include "kernels/cpu/tile_kernels.h"

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

// A work item's logits while its heads are folded: [row tile][vocabulary row of the block][lane],
// the layout the register blocks leave them in, so that a head adds its block with whole-vector
// adds and only the finished fold is turned into z's [row][vocab]. One block a thread, kept
// from item to item (48 KiB at 128 rows): a fold stores or takes every row's lanes it covers
// before adding to them, so what an earlier item left never reaches the logits.
float* lane_block(std::int64_t rows) {
  thread_local std::vector<float> lanes;
  const auto floats =
      static_cast<std::size_t>((rows + kTileRows - 1) / kTileRows * kVocabBlock * kTileRows);
  if (lanes.size() < floats) lanes.resize(floats);
  return lanes.data();
}

// Logits of T row tiles (transposed in ht, [tile][d][16]) for vocabulary rows [v, v + V) of w:
// acc = fma(h[d], w[d], acc) from +0 over d ascending, per lane, so the bits are
// head_partial_logits's. Written into the lane block (lanes[tile][v - v0][16]) with `first`,
// else added to what it holds (lanes = lanes + acc, one step of fold_head_logits).
template <int T, int V>
void project_block(const float* ht, const float* w, std::int64_t ldw, std::int64_t v,
                   std::int64_t v0, int dim, bool first, float* lanes) {
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
    for (int x = 0; x < V; ++x) {
      float* to = lanes + (t * kVocabBlock + (v - v0) + x) * kTileRows;
      simd::store(to, first ? acc[t][x] : simd::add(simd::load(to), acc[t][x]));
    }
  }
}

// Vocabulary rows [v0, v1) for T row tiles (transposed in ht).
template <int T>
void project_tiles(const float* ht, const ProjectionJob& j, std::int64_t v0, std::int64_t v1,
                   int dim, bool first, float* lanes) {
  std::int64_t v = v0;
  for (; v + kVocabStep <= v1; v += kVocabStep)
    project_block<T, kVocabStep>(ht, j.w, j.ldw, v, v0, dim, first, lanes);
  for (; v < v1; ++v) project_block<T, 1>(ht, j.w, j.ldw, v, v0, dim, first, lanes);
}

// Vocabulary rows [v0, v1) for every row of the job (transposed in ht, a tile after another)
// into the lane block, or added to it unless `first`.
void project_vocab_block(const ProjectionJob& j, const float* ht, std::int64_t v0, std::int64_t v1,
                         int dim, bool first, float* lanes) {
  const std::int64_t tiles = (j.rows + kTileRows - 1) / kTileRows,
                     tile = std::int64_t{dim} * kTileRows;
  std::int64_t t = 0;
  for (; t + kTiles <= tiles; t += kTiles)
    project_tiles<kTiles>(ht + t * tile, j, v0, v1, dim, first,
                          lanes + t * kVocabBlock * kTileRows);
  for (; t < tiles; ++t)
    project_tiles<1>(ht + t * tile, j, v0, v1, dim, first, lanes + t * kVocabBlock * kTileRows);
}

// Where row r's logit of vocabulary row v0 sits in a lane block of the block starting at v0
// (the next vocabulary row kTileRows floats on).
std::int64_t lane_of(std::int64_t r) {
  return r / kTileRows * kVocabBlock * kTileRows + r % kTileRows;
}

// z[r][v] = lanes for v in [v0, v1): the block's finished logits into z's rows.
void lanes_to_rows(const float* lanes, std::int64_t rows, int vocab, std::int64_t v0,
                   std::int64_t v1, float* z) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* from = lanes + lane_of(r);
    float* row = z + r * vocab + v0;
    for (std::int64_t x = 0; x < v1 - v0; ++x) row[x] = from[x * kTileRows];
  }
}

// The lane block from z's rows (a fold that continues the plane z holds).
void rows_to_lanes(const float* z, std::int64_t rows, int vocab, std::int64_t v0, std::int64_t v1,
                   float* lanes) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* to = lanes + lane_of(r);
    const float* row = z + r * vocab + v0;
    for (std::int64_t x = 0; x < v1 - v0; ++x) to[x * kTileRows] = row[x];
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

// One work item: vocabulary rows [v0, v1) of the fold of `heads` (ht[h]: head h's rows
// transposed), ascending, into `out` ([rows][vocab]). The first head's partials are stored in the
// lane block, or added to `out`'s plane where the fold `continues`; each next head's are added.
// A single head that does not continue is project_rows's block.
void fold_vocab_block(std::span<const ProjectionJob> heads, const std::vector<float>* ht,
                      bool continues, float* out, std::int64_t block, int dim, int vocab) {
  const std::int64_t rows = heads.front().rows, v0 = block * kVocabBlock,
                     v1 = vocab_end(block, vocab);
  float* lanes = lane_block(rows);
  if (continues) rows_to_lanes(out, rows, vocab, v0, v1, lanes);
  for (std::size_t h = 0; h < heads.size(); ++h)
    project_vocab_block(heads[h], ht[h].data(), v0, v1, dim, h == 0 && !continues, lanes);
  lanes_to_rows(lanes, rows, vocab, v0, v1, out);
}

}  // namespace

void project_rows(const ProjectionJob& job, int dim, int vocab) {
  std::vector<float> ht;
  transpose_rows(job, dim, ht);
  for (std::int64_t b = 0; b < blocks_of(vocab); ++b)
    fold_vocab_block(std::span(&job, 1), &ht, false, job.z, b, dim, vocab);
}

void run_projection_jobs(std::span<const ProjectionJob> jobs, int dim, int vocab,
                         ThreadPool& pool) {
  // Each job is a fold of one head that does not continue, into its own z.
  std::vector<FoldedProjectionJob> folds;
  for (const ProjectionJob& j : jobs) folds.push_back(FoldedProjectionJob{{j}, j.z, false});
  run_folded_projection_jobs(folds, dim, vocab, pool);
}

void run_folded_projection_jobs(std::span<const FoldedProjectionJob> jobs, int dim, int vocab,
                                ThreadPool& pool) {
  // Every head's rows transposed once; then one work item per (job, vocabulary block).
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
    const FoldedProjectionJob& j = jobs[i];
    if (!j.heads.empty())
      fold_vocab_block(j.heads, &ht[first_head[i]], j.continues, j.logits, item % blocks, dim,
                       vocab);
  });
}

}  // namespace cpd
