// The tile kernel: up to 64 query rows at once in lane tiles of 16, one SIMD lane per row for
// the scores and the softmax, and the d dimension across lanes for P·V; K and V are read a
// chunk at a time for every lane tile, so a long block streams from memory once per 64 rows. Every
// output element follows the canonical sequential order of attention_math.h; the tests compare it
// bit for bit.
#include <algorithm>
#include <stdexcept>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernel_work.h"
#include "kernels/cpu/simd16.h"
#include "kernels/cpu/simd16_math.h"
#include "kernels/cpu/tile_kernels.h"

namespace cpd {

using simd::F16;

namespace {

// Scores, sixteen keys at a time for every lane tile: those keys' rows of K (8 KB at D = 128)
// are read from memory once for all of them and stay in L1 meanwhile. Lane tiles go in pairs
// over the keys both see (a later tile sees at least the keys an earlier one does). Each
// score is the same fma chain over d whichever call computes it. Lane tile t's transposed rows
// at q_transposed + t·dim·16, its scores [keys][16] at scores + t·n·16.
void tile_scores(const float* q_transposed, const KvRows& k, int tiles,
                 const std::int64_t* tile_keys, std::int64_t n, int dim, float scale,
                 const float* visible_f, float* scores) {
  constexpr std::int64_t kScoreKeys = 16;
  const F16 scale16 = simd::splat(scale);
  const auto qt = [&](int t) {
    return q_transposed + static_cast<std::ptrdiff_t>(t) * dim * kTileRows;
  };
  const auto vis = [&](int t) { return simd::load(visible_f + t * kTileRows); };
  const auto out = [&](int t) { return scores + t * n * kTileRows; };
  for (std::int64_t j0 = 0; j0 < n; j0 += kScoreKeys) {
    for (int t = 0; t < tiles; t += 2) {
      const std::int64_t end = std::min(j0 + kScoreKeys, tile_keys[t]);
      if (t + 1 == tiles) {
        if (end > j0) tile::dot_key_range(qt(t), k, j0, end, dim, scale16, vis(t), out(t));
        continue;
      }
      const std::int64_t next_end = std::min(j0 + kScoreKeys, tile_keys[t + 1]);
      if (end > j0) {
        tile::dot_key_range_pair(qt(t), qt(t + 1), k, j0, end, dim, scale16, vis(t), vis(t + 1),
                                 out(t), out(t + 1));
      }
      const std::int64_t rest = std::max(end, j0);
      if (next_end > rest)
        tile::dot_key_range(qt(t + 1), k, rest, next_end, dim, scale16, vis(t + 1), out(t + 1));
    }
  }
}

// The softmax of each lane tile over its keys (scores as tile_scores wrote them): the max, then
// exp(s - m) and their sum in key order; the probabilities replace the scores, each row's sum
// and max go to l_rows and m_rows.
void tile_softmax(float* scores, int tiles, const std::int64_t* tile_keys, std::int64_t n,
                  const float* visible_f, ProbRounding rounding, float* l_rows, float* m_rows) {
  for (int t = 0; t < tiles; ++t) {
    float* const tile_scores = scores + t * n * kTileRows;
    const F16 vis = simd::load(visible_f + t * kTileRows);
    F16 m = simd::splat(neg_inf_f32());
    for (std::int64_t j = 0; j < tile_keys[t]; ++j)
      m = simd::max(simd::load(tile_scores + j * kTileRows), m);
    // Rows without visible keys keep m = -inf; give them 0 so exp sees -inf, not NaN.
    m = simd::select(simd::gt(vis, simd::splat(0.0f)), m, simd::splat(0.0f));
    F16 l = simd::splat(0.0f);
    for (std::int64_t j = 0; j < tile_keys[t]; ++j) {
      const F16 p = simd::exp(simd::sub(simd::load(tile_scores + j * kTileRows), m));
      l = simd::add(l, p);
      simd::store(tile_scores + j * kTileRows,
                  rounding == ProbRounding::bf16 ? simd::round_bf16(p) : p);
    }
    simd::store(l_rows + t * kTileRows, l);
    simd::store(m_rows + t * kTileRows, m);
  }
}

}  // namespace

void attend_tile(const float* q, std::int64_t first_pos, int rows, const KvRows& k, const KvRows& v,
                 Range keys, int dim, float scale, ProbRounding rounding, TileScratch& scratch,
                 float* out, float* lse) {
  if (dim % 64 != 0 || dim > 256) throw std::invalid_argument("attend_tile: unsupported head dim");
  if (rows < 1 || rows > kAttendRows) throw std::invalid_argument("attend_tile: 1..64 rows");
  const int tiles = (rows + kTileRows - 1) / kTileRows;

  // Visible keys per row (causal by global position), counted from keys.begin; per lane tile,
  // the most any of its rows sees.
  std::int64_t visible[kAttendRows] = {};
  float visible_f[kAttendRows] = {};
  std::int64_t tile_keys[kAttendRows / kTileRows] = {};
  std::int64_t n = 0, pairs = 0;
  for (int r = 0; r < rows; ++r) {
    const std::int64_t last = std::min(keys.end, first_pos + r + 1);
    visible[r] = std::max<std::int64_t>(0, last - keys.begin);
    visible_f[r] = static_cast<float>(visible[r]);
    tile_keys[r / kTileRows] = std::max(tile_keys[r / kTileRows], visible[r]);
    n = std::max(n, visible[r]);
    pairs += visible[r];
  }
  kernel_work_counters::add_forward(static_cast<std::uint64_t>(pairs));
  for (int r = 0; r < rows; ++r) {
    if (visible[r] > 0) continue;
    std::fill(out + r * dim, out + (r + 1) * dim, 0.0f);
    lse[r] = neg_inf_f32();
  }
  if (n == 0) return;

  // Per lane tile t (rows 16t …): its transposed rows and its scores [keys][16], n keys apart.
  scratch.q_transposed.resize(static_cast<std::size_t>(dim) * kAttendRows);
  for (int t = 0; t < tiles; ++t) {
    tile::transpose(q + static_cast<std::ptrdiff_t>(t) * kTileRows * dim,
                    std::min(kTileRows, rows - t * kTileRows), dim,
                    scratch.q_transposed.data() + static_cast<std::ptrdiff_t>(t) * dim * kTileRows);
  }
  const std::int64_t stride = n * kTileRows;
  if (scratch.scores.size() < static_cast<std::size_t>(stride * tiles)) {
    scratch.scores.resize(static_cast<std::size_t>(stride * tiles));
  }
  tile_scores(scratch.q_transposed.data(), k, tiles, tile_keys, n, dim, scale, visible_f,
              scratch.scores.data());

  float l_rows[kAttendRows], m_rows[kAttendRows];
  tile_softmax(scratch.scores.data(), tiles, tile_keys, n, visible_f, rounding, l_rows, m_rows);

  // P·V, each row stopping exactly at its last visible key, then divided by the row's sum:
  // out = acc / l, lse = m + log(l). A row that sees no key keeps the -inf written above, and
  // the +0s rows_times wrote it (its sums start from +0 and take no key).
  tile::rows_times(scratch.scores.data(), stride, v, dim, visible, rows, out);
  for (int r = 0; r < rows; ++r) {
    if (visible[r] == 0) continue;
    const F16 lr = simd::splat(l_rows[r]);
    for (int c = 0; c < dim; c += 16)
      simd::store(out + r * dim + c, simd::div(simd::load(out + r * dim + c), lr));
    lse[r] = m_rows[r] + log_f32(l_rows[r]);
  }
}

}  // namespace cpd
