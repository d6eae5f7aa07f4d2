// Backward tiles: the tile's scores, dP, P and dS with one SIMD lane per query row; dq over
// the block's keys with d across lanes; dk and dv of the block's keys accumulated over the
// tile's rows in order. Every element follows attention_backward_math.h exactly.
#include <algorithm>
#include <stdexcept>

#include "cpdrift/cpu/attention_backward.h"
#include "cpdrift/cpu/kernel_work.h"
#include "simd16_math.h"
#include "tile_kernels.h"

namespace cpd {

using simd::F16;

void backward_tile(const float* q, const float* d_out, const float* lse, const float* delta,
                   std::int64_t first_pos, int rows, const float* k, const float* v, Range keys,
                   int dim, float scale, BackwardScratch& s, float* dq, float* dk, float* dv) {
  if (dim % 64 != 0)
    throw std::invalid_argument("backward_tile: head dim must be a multiple of 64");
  if (rows < 1 || rows > kTileRows) throw std::invalid_argument("backward_tile: 1..16 rows");
  // Visible keys per row; keys past the tile's last row are never visible here.
  std::int64_t visible[kTileRows] = {};
  float visible_f[kTileRows] = {}, lse_lanes[kTileRows] = {}, delta_lanes[kTileRows] = {};
  std::int64_t n = 0, pairs = 0;
  for (int r = 0; r < rows; ++r) {
    visible[r] = std::clamp<std::int64_t>(first_pos + r + 1 - keys.begin, 0, keys.size());
    visible_f[r] = static_cast<float>(visible[r]);
    lse_lanes[r] = lse[r];
    delta_lanes[r] = delta[r];
    n = std::max(n, visible[r]);
    pairs += visible[r];
  }
  kernel_work_counters::add_backward(static_cast<std::uint64_t>(pairs));
  s.q_t.resize(static_cast<std::size_t>(dim) * kTileRows);
  s.d_out_t.resize(s.q_t.size());
  const std::size_t tile = static_cast<std::size_t>(n) * kTileRows;
  if (s.p.size() < tile) {
    s.p.resize(tile);
    s.ds.resize(tile);
    s.dp.resize(tile);
  }
  tile::transpose(q, rows, dim, s.q_t.data());
  tile::transpose(d_out, rows, dim, s.d_out_t.data());
  tile::dot_key_range(s.q_t.data(), k, 0, n, dim, simd::splat(scale), simd::load(visible_f),
                      s.p.data());
  tile::dot_key_range(s.d_out_t.data(), v, 0, n, dim, simd::splat(1.0f),
                      simd::splat(static_cast<float>(n + 1)), s.dp.data());
  const F16 lse16 = simd::load(lse_lanes), delta16 = simd::load(delta_lanes);
  for (std::int64_t j = 0; j < n; ++j) {
    const F16 p = simd::exp(simd::sub(simd::load(s.p.data() + j * kTileRows), lse16));
    simd::store(s.p.data() + j * kTileRows, p);
    simd::store(s.ds.data() + j * kTileRows,
                simd::mul(p, simd::sub(simd::load(s.dp.data() + j * kTileRows), delta16)));
  }
  // dq: each row over exactly its visible keys.
  tile::rows_times(s.ds.data(), 0, k, dim, visible, rows, dq);
  // dk, dv over the tile's rows in order. A row that cannot see key j (it comes before j) has
  // P = exp(-inf) = +0 and dS = ±0, and every earlier row cannot see j either, so j's
  // accumulators are still the +0 they started from: adding ±0 keeps +0, the same bits as
  // leaving the masked rows out, which the definition does.
  for (int col = 0; col < dim; col += 64) {
    for (std::int64_t j0 = 0; j0 < n; j0 += 4) {
      const int nk = static_cast<int>(std::min<std::int64_t>(4, n - j0));
      tile::keys4_accumulate(s.ds.data(), q, rows, dim, col, j0, nk, dk);
      tile::keys4_accumulate(s.p.data(), d_out, rows, dim, col, j0, nk, dv);
    }
  }
}

void fold_terms(std::span<const float* const> terms, std::size_t n, float* out) {
  if (terms.empty()) return;
  std::copy(terms[0], terms[0] + n, out);
  for (std::size_t t = 1; t < terms.size(); ++t) {
    const float* x = terms[t];
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
      for (std::int64_t r = 0; r < qb.tokens.size(); r += kTileRows) {
        const int rows = static_cast<int>(std::min<std::int64_t>(kTileRows, qb.tokens.size() - r));
        backward_tile(qb.q + r * dim, qb.d_out + r * dim, qb.lse + r, qb.delta + r,
                      qb.tokens.begin + r, rows, unit.k, unit.v, unit.keys, dim, scale, scratch,
                      qb.dq_partial + r * dim, scratch.dk.data(), scratch.dv.data());
      }
      for (std::size_t i = 0; i < n; ++i) {
        unit.dk_total[i] = first ? scratch.dk[i] : unit.dk_total[i] + scratch.dk[i];
        unit.dv_total[i] = first ? scratch.dv[i] : unit.dv_total[i] + scratch.dv[i];
      }
      first = false;
    }
  });
}

}  // namespace cpd
