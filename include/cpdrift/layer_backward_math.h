// The attention layer's backward around the core (docs/numerics.md §11): each gradient's
// canonical FP32 order, so that a TP or CP split only decides where a piece runs.
//
//   o_proj      dA[t][c]  = dot_seq(dY[t], W_o[·, c]) over the hidden outputs (no TP splits them)
//               dW_o[o][c] = the token sum of dY[t][o]·A[t][c] (layer_math.h's token blocks)
//   RoPE        the rotation's transpose, products and sums as separate FP32 operations
//   head norm   ĝ = w·dy; m = dot_seq(ĝ, x̂)/D; dx = r·(ĝ − x̂·m); dw: (token block, head group)
//               partials, one fma chain over the block's tokens, each token's heads ascending,
//               folded in ascending (block, group) order, block-major
//   q/k/v proj  dW[f][i] = the token sum of dP[t][f]·X[t][i]; the bias's = the token sum of dP
//               (an fma with 1.0 is the add); dX[t][i] over the features TP splits: per head
//               group one chain over its features — its query heads' q features, then its KV
//               head's k, then its v — folded over the groups ascending (o_proj_groups' order)
#pragma once

#include <cmath>
#include <cstdint>

#include "cpdrift/attention_math.h"
#include "cpdrift/hd.h"

namespace cpd {

/// The transpose of rope_rotate_pair: (dx1, dx2) from the rotated pair's gradient (dy1, dy2)
/// with the same cos c and sin s: dx1 = dy1·c + dy2·s, dx2 = dy2·c − dy1·s, each product and
/// sum one FP32 rounding (the autograd of `q·cos + rotate_half(q)·sin`).
CPD_HD void rope_unrotate_pair(float& g1, float& g2, float c, float s) {
  const float a = g1 * c, b = g2 * s;
  const float e = g2 * c, f = g1 * s;
  g1 = a + b;
  g2 = e - f;
}

/// The transpose of rope_rotate_row, in place.
CPD_HD void rope_unrotate_row(float* g, const float* cos_row, const float* sin_row, int half) {
  for (int i = 0; i < half; ++i) rope_unrotate_pair(g[i], g[i + half], cos_row[i], sin_row[i]);
}

/// The backward of head_rms_norm for one head: from the head's input `x` (before the norm), the
/// norm's weight `w` and the gradient `dy` of its output, the input's gradient `dx` and the
/// normalised input `xhat` (x̂ = x·r, the forward's bits) that the weight's gradient reads.
/// r as the forward; ĝ[d] = w[d]·dy[d]; m = dot_seq(ĝ, x̂)/dim; dx[d] = r·(ĝ[d] − x̂[d]·m), each
/// operation one FP32 rounding. `dx` may be `dy`.
CPD_HD void head_rms_norm_backward(const float* x, const float* w, const float* dy, int dim,
                                   float eps, float* dx, float* xhat) {
  const float mean = dot_seq(x, x, dim) / static_cast<float>(dim);
  const float r = 1.0f / sqrtf(mean + eps);
  float m = 0.0f;
  for (int d = 0; d < dim; ++d) {
    xhat[d] = x[d] * r;
    m = fma_f32(w[d] * dy[d], xhat[d], m);
  }
  m = m / static_cast<float>(dim);
  for (int d = 0; d < dim; ++d) dx[d] = r * (w[d] * dy[d] - xhat[d] * m);
}

/// One token's contribution to a norm weight's (token block, head group) partial: for each of
/// the group's `heads` in order, acc[d] = fma(dy[h][d], x̂[h][d], acc[d]) (rows of `dim`).
CPD_HD void norm_weight_accumulate(const float* dy, const float* xhat, int heads, int dim,
                                   float* acc) {
  for (int h = 0; h < heads; ++h) {
    for (int d = 0; d < dim; ++d) acc[d] = fma_f32(dy[h * dim + d], xhat[h * dim + d], acc[d]);
  }
}

}  // namespace cpd
