// Backward tiles: up to sixteen lane tiles of 16 query rows, a chunk of keys at a time: the scores,
// dP, P and dS with one SIMD lane per query row; dq over the block's keys with d across lanes;
// dk and dv of the chunk's keys accumulated over the rows in order. Every element follows
// attention_backward_math.h exactly.
#include <algorithm>
#include <stdexcept>
#include <utility>

#include "kernels/cpu/attention_backward.h"
#include "kernels/cpu/kernel_work.h"
#include "kernels/cpu/simd16_math.h"
#include "kernels/cpu/tile_kernels.h"

namespace cpd {

using simd::F16;

// Keys a keys_accumulate pass carries (× 4 vectors of 16 columns each): per row, 4 loads of its
// 64 columns for 4·kGroupKeys fmas. With 6 on AVX-512 (24 accumulators of its 32 registers) a
// backward tile reads its rows from L2 a third less often than with 4; AVX2's 16 registers,
// two an F16, already spill at 4.
#if defined(CPD_SIMD16_AVX512)
constexpr int kGroupKeys = 6;
#else
constexpr int kGroupKeys = 4;
#endif
static_assert(kGroupKeys <= 8, "the rest of a chunk's keys goes in passes of 4, 2 and 1");

// Keys of a backward chunk: its P, dP and dS for 256 rows (three times 128 KB) stay in L2.
constexpr std::int64_t kBackwardKeyChunk = 128;

namespace {

// P = exp(score − lse) and dS = P·(dP − Δ) of lane tiles [first_tile, tiles) over a chunk's
// `keys` keys, P in place of the scores (s.p), dS into s.ds; lse_lanes and delta_lanes per row.
void probabilities_and_ds(BackwardScratch& s, std::size_t chunk, int first_tile, int tiles,
                          std::int64_t keys, const float* lse_lanes, const float* delta_lanes) {
  for (int t = first_tile; t < tiles; ++t) {
    float *p = s.p.data() + t * chunk, *ds = s.ds.data() + t * chunk, *dp = s.dp.data() + t * chunk;
    const F16 lse16 = simd::load(lse_lanes + t * kTileRows),
              delta16 = simd::load(delta_lanes + t * kTileRows);
    for (std::int64_t j = 0; j < keys; ++j) {
      const F16 pj = simd::exp(simd::sub(simd::load(p + j * kTileRows), lse16));
      simd::store(p + j * kTileRows, pj);
      simd::store(ds + j * kTileRows,
                  simd::mul(pj, simd::sub(simd::load(dp + j * kTileRows), delta16)));
    }
  }
}

// dk, dv of the chunk's keys [j0, j1) over rows [first_row, rows) in order, one pass per key
// group. A row that cannot see key j (it comes before j) has P = +0 and dS = ±0, and every
// earlier row cannot see j either, so j's accumulators are still the +0 they started from:
// adding ±0 keeps +0, the same bits as leaving the masked rows out, which the definition does.
void key_gradients(const BackwardScratch& s, std::size_t chunk, std::int64_t j0, std::int64_t j1,
                   const float* q, const float* d_out, int first_row, int rows, int dim, float* dk,
                   float* dv) {
  for (int col = 0; col < dim; col += 64) {
    const auto both = [&]<int kKeys>(std::int64_t jj) {
      tile::keys_accumulate<kKeys>(s.ds.data(), chunk, j0, q, first_row, rows, dim, col, jj, dk);
      tile::keys_accumulate<kKeys>(s.p.data(), chunk, j0, d_out, first_row, rows, dim, col, jj, dv);
    };
    std::int64_t jj = j0;
    for (; jj + kGroupKeys <= j1; jj += kGroupKeys) both.template operator()<kGroupKeys>(jj);
    // The rest, fewer than kGroupKeys keys, in passes of 4, 2 and 1.
    if (j1 - jj >= 4) both.template operator()<4>(std::exchange(jj, jj + 4));
    if (j1 - jj >= 2) both.template operator()<2>(std::exchange(jj, jj + 2));
    if (jj < j1) both.template operator()<1>(jj);
  }
}

}  // namespace

void backward_tile(const float* q, const float* d_out, const float* lse, const float* delta,
                   std::int64_t first_pos, int rows, const float* k, const float* v, Range keys,
                   int dim, float scale, BackwardScratch& s, float* dq, float* dk, float* dv) {
  if (dim % 64 != 0)
    throw std::invalid_argument("backward_tile: head dim must be a multiple of 64");
  if (rows < 1 || rows > kBackwardRows) throw std::invalid_argument("backward_tile: 1..256 rows");
  const int tiles = (rows + kTileRows - 1) / kTileRows;
  // Visible keys per row; keys past the tile's last row are never visible here. Per lane tile,
  // the most any of its rows sees.
  std::int64_t visible[kBackwardRows] = {}, tile_keys[kBackwardRows / kTileRows] = {};
  float visible_f[kBackwardRows] = {}, lse_lanes[kBackwardRows] = {},
        delta_lanes[kBackwardRows] = {};
  std::int64_t n = 0, pairs = 0;
  for (int r = 0; r < rows; ++r) {
    visible[r] = std::clamp<std::int64_t>(first_pos + r + 1 - keys.begin, 0, keys.size());
    visible_f[r] = static_cast<float>(visible[r]);
    lse_lanes[r] = lse[r];
    delta_lanes[r] = delta[r];
    tile_keys[r / kTileRows] = std::max(tile_keys[r / kTileRows], visible[r]);
    n = std::max(n, visible[r]);
    pairs += visible[r];
  }
  kernel_work_counters::add_backward(static_cast<std::uint64_t>(pairs));
  constexpr std::int64_t kChunk = kBackwardKeyChunk;
  const std::size_t lanes = static_cast<std::size_t>(dim) * kTileRows,
                    chunk = static_cast<std::size_t>(kChunk) * kTileRows;
  s.q_t.resize(lanes * kBackwardRows / kTileRows);
  s.d_out_t.resize(s.q_t.size());
  s.p.resize(chunk * kBackwardRows / kTileRows);
  s.ds.resize(s.p.size());
  s.dp.resize(s.p.size());
  for (int t = 0; t < tiles; ++t) {
    const int tile_rows = std::min(kTileRows, rows - t * kTileRows);
    tile::transpose(q + t * kTileRows * dim, tile_rows, dim, s.q_t.data() + t * lanes);
    tile::transpose(d_out + t * kTileRows * dim, tile_rows, dim, s.d_out_t.data() + t * lanes);
  }
  std::fill(dq, dq + static_cast<std::ptrdiff_t>(rows) * dim, 0.0f);
  // A chunk of keys at a time for every lane tile in row order: the chunk's K, V, dK and dV are
  // read from memory once for all of them. Each row's dq continues over the keys in ascending
  // order, and per key the rows add in ascending order.
  for (std::int64_t j0 = 0; j0 < n; j0 += kChunk) {
    // The lane tiles that see a key of this chunk (tile_keys grows with t); each of them gets P
    // and dS over all the chunk's keys [j0, j1), exp(-inf) = +0 and dS = ±0 past its rows' last
    // visible key.
    const std::int64_t j1 = std::min(j0 + kChunk, n);
    int first_tile = 0;
    while (tile_keys[first_tile] <= j0) ++first_tile;
    // Scores and dP, lane tiles in pairs (the same keys for all of them here).
    const F16 scale16 = simd::splat(scale), one = simd::splat(1.0f),
              unmasked = simd::splat(static_cast<float>(j1 + 1));
    const auto vis = [&](int t) { return simd::load(visible_f + t * kTileRows); };
    int t = first_tile;
    for (; t + 1 < tiles; t += 2) {
      tile::dot_key_range_pair(s.q_t.data() + t * lanes, s.q_t.data() + (t + 1) * lanes, k, j0, j1,
                               dim, scale16, vis(t), vis(t + 1), s.p.data() + t * chunk,
                               s.p.data() + (t + 1) * chunk, j0);
      tile::dot_key_range_pair(s.d_out_t.data() + t * lanes, s.d_out_t.data() + (t + 1) * lanes, v,
                               j0, j1, dim, one, unmasked, unmasked, s.dp.data() + t * chunk,
                               s.dp.data() + (t + 1) * chunk, j0);
    }
    if (t < tiles) {
      tile::dot_key_range(s.q_t.data() + t * lanes, k, j0, j1, dim, scale16, vis(t),
                          s.p.data() + t * chunk, j0);
      tile::dot_key_range(s.d_out_t.data() + t * lanes, v, j0, j1, dim, one, unmasked,
                          s.dp.data() + t * chunk, j0);
    }
    probabilities_and_ds(s, chunk, first_tile, tiles, j1 - j0, lse_lanes, delta_lanes);
    // dq: each row over exactly its visible keys, the row groups running on across lane tiles.
    const int first_row = first_tile * kTileRows;
    tile::rows_times_range(s.ds.data() + first_tile * chunk, chunk, j0, k, dim, visible + first_row,
                           rows - first_row, j0, j1, dq + first_row * dim);
    key_gradients(s, chunk, j0, j1, q, d_out, first_row, rows, dim, dk, dv);
  }
}

void fold_terms(std::span<const float* const> terms, std::size_t n, float* out,
                std::size_t offset) {
  if (terms.empty()) return;
  std::copy(terms[0] + offset, terms[0] + offset + n, out);
  for (std::size_t t = 1; t < terms.size(); ++t) {
    const float* x = terms[t] + offset;
    for (std::size_t i = 0; i < n; ++i) out[i] = out[i] + x[i];
  }
}

void run_backward_units(std::span<const BackwardUnit> units, int dim, float scale,
                        ThreadPool& pool) {
  pool.parallel_for(static_cast<std::int64_t>(units.size()), [&](std::int64_t u) {
    thread_local BackwardScratch scratch;
    const BackwardUnit& unit = units[static_cast<std::size_t>(u)];
    const std::size_t n = static_cast<std::size_t>(unit.keys.size()) * dim;
    scratch.dk.resize(n);
    scratch.dv.resize(n);
    bool first = !unit.accumulate;
    for (const QueryBlockRows& qb : unit.blocks) {
      std::fill(scratch.dk.begin(), scratch.dk.end(), 0.0f);
      std::fill(scratch.dv.begin(), scratch.dv.end(), 0.0f);
      for (std::int64_t r = 0; r < qb.tokens.size(); r += kBackwardRows) {
        const int rows =
            static_cast<int>(std::min<std::int64_t>(kBackwardRows, qb.tokens.size() - r));
        backward_tile(qb.q + r * dim, qb.d_out + r * dim, qb.lse + r, qb.delta + r,
                      qb.tokens.begin + r, rows, unit.k, unit.v, unit.keys, dim, scale, scratch,
                      qb.dq_partial + r * dim, scratch.dk.data(), scratch.dv.data());
      }
      for (std::size_t i = 0; i < n; ++i) {
        unit.dk_total[i] = first ? scratch.dk[i] : unit.dk_total[i] + scratch.dk[i];
        unit.dv_total[i] = first ? scratch.dv[i] : unit.dv_total[i] + scratch.dv[i];
      }
      if (qb.dk_lane != nullptr) {
        for (std::size_t i = 0; i < n; ++i) {
          qb.dk_lane[i] = qb.lane_first ? scratch.dk[i] : qb.dk_lane[i] + scratch.dk[i];
          qb.dv_lane[i] = qb.lane_first ? scratch.dv[i] : qb.dv_lane[i] + scratch.dv[i];
        }
      }
      first = false;
    }
  });
}

}  // namespace cpd
