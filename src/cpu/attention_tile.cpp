// The tile kernel: 16 query rows at once, one SIMD lane per row for the scores and the
// softmax, and the d dimension across lanes for P·V. Every output element follows the
// canonical sequential order of attention_math.h; the tests compare it bit for bit.
#include <algorithm>
#include <stdexcept>

#include "cpdrift/cpu/attention.h"
#include "simd16.h"
#include "simd16_math.h"

namespace cpd {
namespace {

using simd::F16;

// Scores of the tile against keys [j0, j0 + kKeys): s = dot_seq(q_r, k_j) · scale, stored
// transposed as scores[j][r]; keys a row cannot see become -inf.
template <int kKeys>
void score_keys(const float* qt, const float* k, std::int64_t j0, int dim, F16 scale, F16 visible,
                float* scores) {
  F16 acc[kKeys];
  for (int x = 0; x < kKeys; ++x) acc[x] = simd::splat(0.0f);
  const float* kj = k + j0 * dim;
  for (int d = 0; d < dim; ++d) {
    const F16 qd = simd::load(qt + d * kTileRows);
    for (int x = 0; x < kKeys; ++x) acc[x] = simd::fma(qd, simd::splat(kj[x * dim + d]), acc[x]);
  }
  const F16 neg_inf = simd::splat(neg_inf_f32());
  for (int x = 0; x < kKeys; ++x) {
    const F16 s = simd::mul(acc[x], scale);
    const F16 j = simd::splat(static_cast<float>(j0 + x));
    simd::store(scores + (j0 + x) * kTileRows, simd::select(simd::lt(j, visible), s, neg_inf));
  }
}

// P·V for four rows of the tile and 64 columns starting at `col`: acc = fma(p̃_j, v_j, acc)
// over j ascending, every row stopping exactly at its own last visible key.
void pv_rows4(const float* p, const float* v, int dim, int col, int r0, const std::int64_t* visible,
              int nrows, float* out, const float* l) {
  std::int64_t common = visible[r0];
  for (int r = 1; r < nrows; ++r) common = std::min(common, visible[r0 + r]);
  F16 acc[4][4];
  for (auto& row : acc) {
    for (F16& a : row) a = simd::splat(0.0f);
  }
  for (std::int64_t j = 0; j < common; ++j) {
    const float* vj = v + j * dim + col;
    const F16 v0 = simd::load(vj), v1 = simd::load(vj + 16), v2 = simd::load(vj + 32),
              v3 = simd::load(vj + 48);
    const float* pj = p + j * kTileRows + r0;
    for (int r = 0; r < 4; ++r) {
      const F16 pr = simd::splat(pj[r]);
      acc[r][0] = simd::fma(pr, v0, acc[r][0]);
      acc[r][1] = simd::fma(pr, v1, acc[r][1]);
      acc[r][2] = simd::fma(pr, v2, acc[r][2]);
      acc[r][3] = simd::fma(pr, v3, acc[r][3]);
    }
  }
  for (int r = 0; r < nrows; ++r) {
    for (std::int64_t j = common; j < visible[r0 + r]; ++j) {
      const F16 pr = simd::splat(p[j * kTileRows + r0 + r]);
      for (int x = 0; x < 4; ++x) {
        acc[r][x] = simd::fma(pr, simd::load(v + j * dim + col + 16 * x), acc[r][x]);
      }
    }
    if (visible[r0 + r] == 0) continue;
    const F16 lr = simd::splat(l[r0 + r]);
    for (int x = 0; x < 4; ++x) {
      simd::store(out + (r0 + r) * dim + col + 16 * x, simd::div(acc[r][x], lr));
    }
  }
}

}  // namespace

void attend_tile(const float* q, std::int64_t first_pos, int rows, const float* k, const float* v,
                 Range keys, int dim, float scale, ProbRounding rounding, TileScratch& scratch,
                 float* out, float* lse) {
  if (dim % 64 != 0 || dim > 256) throw std::invalid_argument("attend_tile: unsupported head dim");
  if (rows < 1 || rows > kTileRows) throw std::invalid_argument("attend_tile: 1..16 rows");

  // Visible keys per row (causal by global position), counted from keys.begin.
  std::int64_t visible[kTileRows] = {};
  float visible_f[kTileRows] = {};
  std::int64_t n = 0;
  for (int r = 0; r < rows; ++r) {
    const std::int64_t last = std::min(keys.end, first_pos + r + 1);
    visible[r] = std::max<std::int64_t>(0, last - keys.begin);
    visible_f[r] = static_cast<float>(visible[r]);
    n = std::max(n, visible[r]);
  }
  for (int r = 0; r < rows; ++r) {
    if (visible[r] > 0) continue;
    std::fill(out + r * dim, out + (r + 1) * dim, 0.0f);
    lse[r] = neg_inf_f32();
  }
  if (n == 0) return;

  scratch.q_transposed.assign(static_cast<std::size_t>(dim) * kTileRows, 0.0f);
  for (int r = 0; r < rows; ++r) {
    for (int d = 0; d < dim; ++d) scratch.q_transposed[d * kTileRows + r] = q[r * dim + d];
  }
  if (scratch.scores.size() < static_cast<std::size_t>(n) * kTileRows) {
    scratch.scores.resize(static_cast<std::size_t>(n) * kTileRows);
  }
  float* scores = scratch.scores.data();
  const float* qt = scratch.q_transposed.data();
  const F16 scale16 = simd::splat(scale), vis = simd::load(visible_f);

  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) score_keys<8>(qt, k, j, dim, scale16, vis, scores);
  for (; j < n; ++j) score_keys<1>(qt, k, j, dim, scale16, vis, scores);

  F16 m = simd::splat(neg_inf_f32());
  for (j = 0; j < n; ++j) m = simd::max(simd::load(scores + j * kTileRows), m);
  // Rows without visible keys keep m = -inf; give them 0 so exp sees -inf, not NaN.
  m = simd::select(simd::gt(vis, simd::splat(0.0f)), m, simd::splat(0.0f));

  F16 l = simd::splat(0.0f);
  for (j = 0; j < n; ++j) {
    const F16 p = simd::exp(simd::sub(simd::load(scores + j * kTileRows), m));
    l = simd::add(l, p);
    simd::store(scores + j * kTileRows, rounding == ProbRounding::bf16 ? simd::round_bf16(p) : p);
  }
  float l_rows[kTileRows], m_rows[kTileRows];
  simd::store(l_rows, l);
  simd::store(m_rows, m);

  for (int r0 = 0; r0 < rows; r0 += 4) {
    const int nrows = std::min(4, rows - r0);
    for (int col = 0; col < dim; col += 64) {
      pv_rows4(scores, v, dim, col, r0, visible, nrows, out, l_rows);
    }
  }
  for (int r = 0; r < rows; ++r) {
    if (visible[r] > 0) lse[r] = m_rows[r] + log_f32(l_rows[r]);
  }
}

}  // namespace cpd
