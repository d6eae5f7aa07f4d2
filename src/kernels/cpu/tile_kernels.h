// Building blocks of the CPU tile kernels (forward and backward): a tile is up to 16 query rows
// of one head, one SIMD lane per row. Each block keeps the canonical sequential order of every
// output element (cpdrift/attention_math.h, attention_backward_math.h).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>

#include "core/kv_rows.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/simd16.h"

// The innermost loops (dot_keys, dot_keys_flat, rows_times_block, keys_accumulate) stay out of
// line: inlined into a tile kernel, they lose their registers to the code around them (GCC 12
// kept their loop counters on the stack and folded V's row loads into every FMA, four loads
// where one does).

namespace cpd::tile {

using simd::F16;

/// rows [nrows][dim] → transposed [dim][16], lanes past nrows zero: 16 columns at a time, the
/// rest (dim not a multiple of 16) one value at a time.
inline void transpose(const float* rows, int nrows, int dim, float* out) {
  int d = 0;
  for (; d + 16 <= dim; d += 16) simd::transpose16(rows + d, nrows, dim, out + d * kTileRows);
  std::fill(out + d * kTileRows, out + static_cast<std::ptrdiff_t>(dim) * kTileRows, 0.0f);
  for (int r = 0; r < nrows; ++r) {
    for (int c = d; c < dim; ++c) out[c * kTileRows + r] = rows[r * dim + c];
  }
}

/// Scores from the dot products acc[x] of keys j0 + x: acc · scale, stored at
/// out[j0 + x - out_first], lane r -inf for keys at or past visible[r].
template <int kKeys>
inline void store_scores(const F16* acc, std::int64_t j0, F16 scale, F16 visible, float* out,
                         std::int64_t out_first) {
  const F16 neg_inf = simd::splat(neg_inf_f32());
  for (int x = 0; x < kKeys; ++x) {
    const F16 s = simd::mul(acc[x], scale);
    const F16 j = simd::splat(static_cast<float>(j0 + x));
    simd::store(out + (j0 + x - out_first) * kTileRows,
                simd::select(simd::lt(j, visible), s, neg_inf));
  }
}

/// Qwen3's head dim (the product's): there, adjacent key rows take the one-pointer form below.
inline constexpr int kFlatDim = 128;

/// How many key rows from j (up to j1) the one-pointer form may read: adjacent rows
/// (k.run_end) at dim == kFlatDim, none otherwise.
inline std::int64_t adjacent_rows(const KvRows& k, std::int64_t j, std::int64_t j1, int dim) {
  return dim == kFlatDim ? std::min(j1, k.run_end(j)) - j : 0;
}

/// Dot products of the tile (transposed, qt) with keys [j0, j0 + kKeys) of `k`: a sequential
/// fma chain over d each, times `scale`, stored as out[j - out_first][r]; lane r gets -inf for
/// keys at or past visible[r] (counted from key 0 of `k`). Any rows, any dim.
template <int kKeys>
[[gnu::noinline]] inline void dot_keys(const float* qt, const KvRows& k, std::int64_t j0, int dim,
                                       F16 scale, F16 visible, float* out,
                                       std::int64_t out_first = 0) {
  F16 acc[kKeys];
  const float* kj[kKeys];
  for (int x = 0; x < kKeys; ++x) {
    acc[x] = simd::splat(0.0f);
    kj[x] = k.row(j0 + x, dim);
  }
  for (int d = 0; d < dim; ++d) {
    const F16 qd = simd::load(qt + d * kTileRows);
    for (int x = 0; x < kKeys; ++x) acc[x] = simd::fma(qd, simd::splat(kj[x][d]), acc[x]);
  }
  store_scores<kKeys>(acc, j0, scale, visible, out, out_first);
}

/// dot_keys for kTiles lane tiles at once (qt[t], visible[t], out[t]) over kKeys adjacent key
/// rows of kFlatDim floats from kd: one pointer with constant offsets reaches every key (a
/// pointer per key spills out of the general registers), and each key element, broadcast once,
/// feeds every tile's chain. The same chains as dot_keys.
template <int kTiles, int kKeys>
[[gnu::noinline]] inline void dot_keys_flat(const float* const* qt, const float* kd,
                                            std::int64_t j0, F16 scale, const F16* visible,
                                            float* const* out, std::int64_t out_first) {
  F16 acc[kTiles][kKeys];
  for (int t = 0; t < kTiles; ++t) {
    for (int x = 0; x < kKeys; ++x) acc[t][x] = simd::splat(0.0f);
  }
  for (int d = 0; d < kFlatDim; ++d, ++kd) {  // key x's element d at kd[x * kFlatDim]
    F16 q[kTiles];
    for (int t = 0; t < kTiles; ++t) q[t] = simd::in_register(simd::load(qt[t] + d * kTileRows));
    for (int x = 0; x < kKeys; ++x) {
      const F16 c = simd::splat(kd[x * kFlatDim]);
      for (int t = 0; t < kTiles; ++t) acc[t][x] = simd::fma(q[t], c, acc[t][x]);
    }
  }
  for (int t = 0; t < kTiles; ++t)
    store_scores<kKeys>(acc[t], j0, scale, visible[t], out[t], out_first);
}

/// dot_keys over keys [j0, j1) (each key's chain is the same whichever call computes it),
/// key j stored at out[j - out_first]. Adjacent rows go as many keys at once as the registers
/// hold accumulators: an FMA's latency is four of its issue slots, so eight independent chains
/// only just keep both FMA units busy; sixteen leave room (AVX-512's 32 registers; AVX2's 16
/// hold eight keys' 16 lanes).
inline void dot_key_range(const float* qt, const KvRows& k, std::int64_t j0, std::int64_t j1,
                          int dim, F16 scale, F16 visible, float* out, std::int64_t out_first = 0) {
  for (std::int64_t j = j0; j < j1;) {
    const std::int64_t adjacent = adjacent_rows(k, j, j1, dim);
    if (simd::kRegisters >= 32 && adjacent >= 16) {
      dot_keys_flat<1, 16>(&qt, k.row(j, dim), j, scale, &visible, &out, out_first);
      j += 16;
    } else if (adjacent >= 8) {
      dot_keys_flat<1, 8>(&qt, k.row(j, dim), j, scale, &visible, &out, out_first);
      j += 8;
    } else if (j + 8 <= j1) {
      dot_keys<8>(qt, k, j, dim, scale, visible, out, out_first);
      j += 8;
    } else {
      dot_keys<1>(qt, k, j, dim, scale, visible, out, out_first);
      ++j;
    }
  }
}

/// dot_key_range for two lane tiles over the same keys [j0, j1): dot_keys_flat over both on
/// runs of eight adjacent rows where the registers hold both tiles' chains (16 independent
/// chains on 2 + 8 loads a step, where one tile's sixteen keys take 1 + 16: fewer loads per FMA
/// bring the kernel closer to the FMA peak), each tile on its own elsewhere.
inline void dot_key_range_pair(const float* qt0, const float* qt1, const KvRows& k, std::int64_t j0,
                               std::int64_t j1, int dim, F16 scale, F16 visible0, F16 visible1,
                               float* out0, float* out1, std::int64_t out_first = 0) {
  const float* const qt[2] = {qt0, qt1};
  const F16 visible[2] = {visible0, visible1};
  float* const out[2] = {out0, out1};
  for (std::int64_t j = j0; j < j1;) {
    const std::int64_t adjacent = simd::kRegisters >= 32 ? adjacent_rows(k, j, j1, dim) : 0;
    if (adjacent >= 8) {
      dot_keys_flat<2, 8>(qt, k.row(j, dim), j, scale, visible, out, out_first);
      j += 8;
      continue;
    }
    const std::int64_t end = adjacent > 0 ? j + adjacent : j1;
    dot_key_range(qt0, k, j, end, dim, scale, visible0, out0, out_first);
    dot_key_range(qt1, k, j, end, dim, scale, visible1, out1, out_first);
    j = end;
  }
}

/// For rows r0 … r0+nrows-1 (nrows ≤ kRows) of `out` ([rows][dim]), columns [col, col+64) and
/// keys [j0, j1):
///   out[r0+r][col…] = sequential over j0 ≤ j < min(limit[r0+r], j1):
///                     fma(coef(j, r0+r), b[j][col…], ·)
/// continuing from what out holds (exact float loads and stores), or from +0 where `fresh` (out
/// is then only written). Rows share the loop up to their smallest limit, then each finishes on
/// its own, so every row stops exactly at its limit. Row r0+r's coefficient of key j is at
/// coef[(j - coef_first)·16 + r0 % 16 + r] for r < kSplit and at coef_next[(j - coef_first)·16 +
/// r - kSplit] after: a group may run on from one lane tile into the next.
template <int kRows, int kSplit = kRows>
[[gnu::noinline]] inline void rows_times_block(const float* coef, const float* coef_next,
                                               std::int64_t coef_first, const KvRows& b, int dim,
                                               int col, int r0, const std::int64_t* limit,
                                               int nrows, std::int64_t j0, std::int64_t j1,
                                               bool fresh, float* out) {
  const auto coef_row = [&](int r) {
    return r < kSplit ? coef + r0 % kTileRows + r : coef_next + (r - kSplit);
  };
  F16 acc[kRows][4];
  for (int r = 0; r < kRows; ++r) {
    for (int x = 0; x < 4; ++x) {
      acc[r][x] =
          r < nrows && !fresh ? simd::load(out + (r0 + r) * dim + col + 16 * x) : simd::splat(0.0f);
    }
  }
  std::int64_t common = std::min(limit[r0], j1);
  for (int r = 1; r < nrows; ++r) common = std::min(common, limit[r0 + r]);
  // A run of adjacent rows of b at a time (all of them unless paged): pointers that step.
  for (std::int64_t j = j0; j < common;) {
    const std::int64_t run = std::min(common, b.run_end(j));
    const float* bj = b.row(j, dim) + col;
    const float* cj = coef_row(0) + (j - coef_first) * kTileRows;
    const float* cn = coef_next + (j - coef_first) * kTileRows;
    for (; j < run; ++j, bj += dim, cj += kTileRows, cn += kTileRows) {
      const F16 b0 = simd::in_register(simd::load(bj)), b1 = simd::in_register(simd::load(bj + 16)),
                b2 = simd::in_register(simd::load(bj + 32)),
                b3 = simd::in_register(simd::load(bj + 48));
      for (int r = 0; r < kRows; ++r) {
        const F16 c = simd::splat(r < kSplit ? cj[r] : cn[r - kSplit]);
        acc[r][0] = simd::fma(c, b0, acc[r][0]);
        acc[r][1] = simd::fma(c, b1, acc[r][1]);
        acc[r][2] = simd::fma(c, b2, acc[r][2]);
        acc[r][3] = simd::fma(c, b3, acc[r][3]);
      }
    }
  }
  for (int r = 0; r < nrows; ++r) {
    const std::int64_t end = std::min(limit[r0 + r], j1);
    const float* cr = coef_row(r);
    for (std::int64_t j = std::max(common, j0); j < end; ++j) {
      const F16 c = simd::splat(cr[(j - coef_first) * kTileRows]);
      const float* bj = b.row(j, dim) + col;
      for (int x = 0; x < 4; ++x) acc[r][x] = simd::fma(c, simd::load(bj + 16 * x), acc[r][x]);
    }
  }
  for (int r = 0; r < nrows; ++r) {
    for (int x = 0; x < 4; ++x) simd::store(out + (r0 + r) * dim + col + 16 * x, acc[r][x]);
  }
}

using RowsTimesBlock = void (*)(const float*, const float*, std::int64_t, const KvRows&, int, int,
                                int, const std::int64_t*, int, std::int64_t, std::int64_t, bool,
                                float*);

/// The block for a row group of rows_times_cols: `rows` rows from a lane where `in_tile` rows of
/// its tile are left. A block reads the coefficients of all its kRows rows, those past `rows`
/// too, so it may reach past the tile only where the group runs on into the next tile, kSplit
/// being the group's rows in the first. Groups of kWide rows start at multiples of kWide, so a
/// group of six crosses a tile only after 4 or 2 of its rows (at lanes 12 and 14), a last group
/// of four or fewer only after 2, and a group of four never.
template <int kWide>
RowsTimesBlock pick_block(int rows, int in_tile) {
  if (rows > 4) {
    if (rows <= in_tile) return &rows_times_block<kWide>;
    assert(in_tile == 4 || in_tile == 2);
    return in_tile == 4 ? &rows_times_block<kWide, 4> : &rows_times_block<kWide, 2>;
  }
  if (rows > in_tile) {
    assert(in_tile == 2);
    return &rows_times_block<4, 2>;
  }
  // At a tile's last two lanes a block of four would read two lanes past it.
  return in_tile >= 4 ? &rows_times_block<4> : &rows_times_block<2>;
}

/// rows_times_range (below) for the columns [col, col + 64) only, over rows [0, nrows) of any
/// number of lane tiles (tile t's coefficients at coef + t·coef_stride): the row groups one after
/// another over the same 64 columns of the keys [j0, j1), half the bytes of their whole rows.
/// With `fresh`, every row's sum starts from +0 instead of what out holds, and out is written
/// whole (a group with no key here: zeros).
inline void rows_times_cols(const float* coef, std::int64_t coef_stride, std::int64_t coef_first,
                            const KvRows& b, int dim, int col, const std::int64_t* limit, int nrows,
                            std::int64_t j0, std::int64_t j1, bool fresh, float* out) {
  // Groups of six rows where the registers hold their 24 accumulators (each row of b loaded
  // serves more FMAs), the last one of four or fewer; a group runs on into the next lane tile,
  // so four tiles take ten groups of six and one of four, where tile by tile they took twelve.
  constexpr int kWide = simd::kRegisters >= 32 ? 6 : 4;
  for (int r0 = 0; r0 < nrows;) {
    const int rows = std::min(nrows - r0, nrows - r0 > 4 ? kWide : 4);
    bool any = false;
    for (int r = 0; r < rows; ++r) any = any || limit[r0 + r] > j0;
    if (any) {
      const float* tile_coef = coef + (r0 / kTileRows) * coef_stride;
      pick_block<kWide>(rows, kTileRows - r0 % kTileRows)(tile_coef, tile_coef + coef_stride,
                                                          coef_first, b, dim, col, r0, limit, rows,
                                                          j0, j1, fresh, out);
    } else if (fresh) {
      for (int r = r0; r < r0 + rows; ++r) std::fill_n(out + r * dim + col, 64, 0.0f);
    }
    r0 += rows;
  }
}

/// Rows r < nrows of lane tiles (tile t: rows 16t … 16t+15, coefficients of key j at
/// coef + t·coef_stride + (j - coef_first)·16 + r % 16):
///   out[r][…] = sequential over j0 ≤ j < min(limit[r], j1):  fma(coef(j, r), b[j][…], ·)
/// continuing from what out holds (exact float stores and loads), so calls over consecutive key
/// ranges compose into the one sequential order of rows_times.
inline void rows_times_range(const float* coef, std::int64_t coef_stride, std::int64_t coef_first,
                             const KvRows& b, int dim, const std::int64_t* limit, int nrows,
                             std::int64_t j0, std::int64_t j1, float* out) {
  for (int col = 0; col < dim; col += 64)
    rows_times_cols(coef, coef_stride, coef_first, b, dim, col, limit, nrows, j0, j1, false, out);
}

/// For the rows of `groups` tiles (tile g: rows 16g … 16g+15 of `out`, coefficients
/// coef + g·coef_stride as [keys][16], limits limit[16g …]; `nrows` rows in all) and every
/// column:
///   out[r][…] = sequential over j < limit[r]:  fma(coef[j][r], b[j][…], ·)   (from +0)
/// rows_times_block over chunks of kAttendKeyChunk keys, each accumulator started at +0 in the
/// first chunk and carried through `out` (exact float stores and loads) from chunk to chunk: every
/// element keeps its one sequential order, while each chunk of b is read from memory once for
/// all the row groups and columns. The first chunk writes out whole, so it is not cleared
/// first.
inline void rows_times(const float* coef, std::int64_t coef_stride, const KvRows& b, int dim,
                       const std::int64_t* limit, int nrows, float* out) {
  std::int64_t n = 0;
  for (int r = 0; r < nrows; ++r) n = std::max(n, limit[r]);
  if (n == 0) std::fill(out, out + static_cast<std::ptrdiff_t>(nrows) * dim, 0.0f);
  for (std::int64_t j0 = 0; j0 < n; j0 += kAttendKeyChunk) {
    const std::int64_t j1 = std::min(n, j0 + kAttendKeyChunk);
    for (int col = 0; col < dim; col += 64)
      rows_times_cols(coef, coef_stride, 0, b, dim, col, limit, nrows, j0, j1, j0 == 0, out);
  }
}

/// For keys j0 … j0+kKeys-1 and columns [col, col+64):
///   acc_j += sequential over row_begin ≤ r < row_end:  fma(coef(j, r), rows[r][col…], acc_j)
/// where acc_j lives in out[j][col…] (loaded, updated, stored). Row r's coefficients belong to
/// lane tile r / 16: key j's at coef + (r / 16)·tile_stride + (j - coef_first)·16 + r % 16.
template <int kKeys>
[[gnu::noinline]] inline void keys_accumulate(const float* coef, std::size_t tile_stride,
                                              std::int64_t coef_first, const float* rows,
                                              int row_begin, int row_end, int dim, int col,
                                              std::int64_t j0, float* out) {
  F16 acc[kKeys][4];
  for (int x = 0; x < kKeys; ++x) {
    for (int c = 0; c < 4; ++c) acc[x][c] = simd::load(out + (j0 + x) * dim + col + 16 * c);
  }
  for (int r = row_begin; r < row_end;) {
    const int tile_end = std::min(row_end, (r / kTileRows + 1) * kTileRows);
    const float* cr = coef + static_cast<std::size_t>(r / kTileRows) * tile_stride +
                      (j0 - coef_first) * kTileRows + r % kTileRows;
    for (; r < tile_end; ++r, ++cr) {
      const float* row = rows + static_cast<std::ptrdiff_t>(r) * dim + col;
      const F16 r0 = simd::in_register(simd::load(row)),
                r1 = simd::in_register(simd::load(row + 16)),
                r2 = simd::in_register(simd::load(row + 32)),
                r3 = simd::in_register(simd::load(row + 48));
      for (int x = 0; x < kKeys; ++x) {
        const F16 c = simd::splat(cr[x * kTileRows]);
        acc[x][0] = simd::fma(c, r0, acc[x][0]);
        acc[x][1] = simd::fma(c, r1, acc[x][1]);
        acc[x][2] = simd::fma(c, r2, acc[x][2]);
        acc[x][3] = simd::fma(c, r3, acc[x][3]);
      }
    }
  }
  for (int x = 0; x < kKeys; ++x) {
    for (int c = 0; c < 4; ++c) simd::store(out + (j0 + x) * dim + col + 16 * c, acc[x][c]);
  }
}

}  // namespace cpd::tile
