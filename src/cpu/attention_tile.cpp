// The tile kernel: 16 query rows at once, one SIMD lane per row for the scores and the
// softmax, and the d dimension across lanes for P·V. Every output element follows the
// canonical sequential order of attention_math.h; the tests compare it bit for bit.
#include <algorithm>
#include <stdexcept>

#include "cpdrift/cpu/attention.h"
#include "cpdrift/cpu/kernel_work.h"
#include "simd16.h"
#include "simd16_math.h"
#include "tile_kernels.h"

namespace cpd {

using simd::F16;

void attend_tile(const float* q, std::int64_t first_pos, int rows, const KvRows& k, const KvRows& v,
                 Range keys, int dim, float scale, ProbRounding rounding, TileScratch& scratch,
                 float* out, float* lse) {
  if (dim % 64 != 0 || dim > 256) throw std::invalid_argument("attend_tile: unsupported head dim");
  if (rows < 1 || rows > kTileRows) throw std::invalid_argument("attend_tile: 1..16 rows");

  // Visible keys per row (causal by global position), counted from keys.begin.
  std::int64_t visible[kTileRows] = {};
  float visible_f[kTileRows] = {};
  std::int64_t n = 0, pairs = 0;
  for (int r = 0; r < rows; ++r) {
    const std::int64_t last = std::min(keys.end, first_pos + r + 1);
    visible[r] = std::max<std::int64_t>(0, last - keys.begin);
    visible_f[r] = static_cast<float>(visible[r]);
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

  scratch.q_transposed.resize(static_cast<std::size_t>(dim) * kTileRows);
  tile::transpose(q, rows, dim, scratch.q_transposed.data());
  if (scratch.scores.size() < static_cast<std::size_t>(n) * kTileRows) {
    scratch.scores.resize(static_cast<std::size_t>(n) * kTileRows);
  }
  float* scores = scratch.scores.data();
  const float* qt = scratch.q_transposed.data();
  const F16 scale16 = simd::splat(scale), vis = simd::load(visible_f);

  tile::dot_all_keys(qt, k, n, dim, scale16, vis, scores);

  F16 m = simd::splat(neg_inf_f32());
  for (std::int64_t j = 0; j < n; ++j) m = simd::max(simd::load(scores + j * kTileRows), m);
  // Rows without visible keys keep m = -inf; give them 0 so exp sees -inf, not NaN.
  m = simd::select(simd::gt(vis, simd::splat(0.0f)), m, simd::splat(0.0f));

  F16 l = simd::splat(0.0f);
  for (std::int64_t j = 0; j < n; ++j) {
    const F16 p = simd::exp(simd::sub(simd::load(scores + j * kTileRows), m));
    l = simd::add(l, p);
    simd::store(scores + j * kTileRows, rounding == ProbRounding::bf16 ? simd::round_bf16(p) : p);
  }
  float l_rows[kTileRows], m_rows[kTileRows];
  simd::store(l_rows, l);
  simd::store(m_rows, m);

  // P·V, each row stopping exactly at its last visible key, then divided by the row's sum:
  // out = acc / l (rows that see no key keep the zeros written above).
  tile::rows_times(scores, v, dim, visible, rows, out);
  for (int r = 0; r < rows; ++r) {
    if (visible[r] == 0) {
      std::fill(out + r * dim, out + (r + 1) * dim, 0.0f);
      continue;
    }
    const F16 lr = simd::splat(l_rows[r]);
    for (int c = 0; c < dim; c += 16)
      simd::store(out + r * dim + c, simd::div(simd::load(out + r * dim + c), lr));
  }
  for (int r = 0; r < rows; ++r) {
    if (visible[r] > 0) lse[r] = m_rows[r] + log_f32(l_rows[r]);
  }
}

}  // namespace cpd
