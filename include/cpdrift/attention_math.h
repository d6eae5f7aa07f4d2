// The canonical FP32 attention arithmetic (docs/numerics.md), one query row at a time.
//
// These scalar functions *define* the bits of the FP32 reference path. Fast kernels (the
// tiled SIMD CPU kernel, the CUDA kernels) are tested bitwise against them; they may compute
// many rows at once, but every output element must follow exactly this operation order.
#pragma once

#include <cstdint>

#include "cpdrift/bf16.h"
#include "cpdrift/fmath.h"
#include "cpdrift/hd.h"

namespace cpd {

/// What the kernel does with the probabilities before P·V.
enum class ProbRounding : std::uint8_t {
  none,  // FP32 throughout (reference and candidate FP32 paths)
  bf16,  // bf16_kernel emulation: P rounded to BF16 for P·V; the row sum keeps FP32 P
};

/// q·k as a single sequential fma chain over d = 0 … dim-1, starting from +0.
CPD_HD float dot_seq(const float* q, const float* k, int dim) {
  float acc = 0.0f;
  for (int d = 0; d < dim; ++d) acc = fma_f32(q[d], k[d], acc);
  return acc;
}

/// Partial attention state of one query row against `n_keys` visible keys (rows of `k`/`v`,
/// row-major, `dim` wide; the caller has already removed keys the causal mask hides, so
/// keys are exactly the visible ones in ascending position).
///
///   s_j = dot_seq(q, k_j) · scale;  m = max_j s_j;  p_j = exp(s_j - m)
///   l = (((0 + p_0) + p_1) + …);    acc_d = fma(p̃_j, v_jd, acc_d) over j ascending from +0
///   out_d = acc_d / l;  lse = m + log(l)
///
/// p̃_j = p_j, or round_bf16(p_j) under ProbRounding::bf16. No visible key: out = 0,
/// lse = -inf. `out` needs `dim` floats; dim ≤ 256.
CPD_HD void partial_state_row(const float* q, const float* k, const float* v, int n_keys, int dim,
                              float scale, ProbRounding rounding, float* out, float* lse) {
  if (n_keys <= 0) {
    for (int d = 0; d < dim; ++d) out[d] = 0.0f;
    *lse = neg_inf_f32();
    return;
  }
  float m = neg_inf_f32();
  for (int j = 0; j < n_keys; ++j) {
    const float s = dot_seq(q, k + static_cast<std::int64_t>(j) * dim, dim) * scale;
    m = s > m ? s : m;
  }
  float acc[256];
  for (int d = 0; d < dim; ++d) acc[d] = 0.0f;
  float l = 0.0f;
  for (int j = 0; j < n_keys; ++j) {
    const float s = dot_seq(q, k + static_cast<std::int64_t>(j) * dim, dim) * scale;
    const float p = exp_f32(s - m);
    l = l + p;
    const float pv = rounding == ProbRounding::bf16 ? round_bf16(p) : p;
    const float* vj = v + static_cast<std::int64_t>(j) * dim;
    for (int d = 0; d < dim; ++d) acc[d] = fma_f32(pv, vj[d], acc[d]);
  }
  for (int d = 0; d < dim; ++d) out[d] = acc[d] / l;
  *lse = m + log_f32(l);
}

/// log(exp(a) + exp(b)) = max + log1p(exp(min - max)); exactly a when b = -inf (and vice
/// versa), which makes fully masked blocks the identity of the merge.
CPD_HD float logaddexp_f32(float a, float b) {
  if (b == neg_inf_f32()) return a;
  if (a == neg_inf_f32()) return b;
  const float hi = a > b ? a : b;
  const float lo = a > b ? b : a;
  return hi + log1p_f32(exp_f32(lo - hi));
}

/// The scalars of one merge step a ← a ⊕ b (design §3), shared by every implementation:
/// identity when l_b = -inf, a copy of b when l_a = -inf, else
///   l = logaddexp(l_a, l_b);  w_a = exp(l_a - l);  w_b = exp(l_b - l)   (0 when l is not finite)
struct MergeWeights {
  enum Mode : int { keep_a = 0, take_b = 1, combine = 2 };
  int mode;
  float lse, w_a, w_b;
};

CPD_HD MergeWeights merge_weights(float l_a, float l_b) {
  if (l_b == neg_inf_f32()) return MergeWeights{MergeWeights::keep_a, l_a, 1.0f, 0.0f};
  if (l_a == neg_inf_f32()) return MergeWeights{MergeWeights::take_b, l_b, 0.0f, 1.0f};
  const float l = logaddexp_f32(l_a, l_b);
  const bool finite = is_finite_f32(l);
  return MergeWeights{MergeWeights::combine, l, finite ? exp_f32(l_a - l) : 0.0f,
                      finite ? exp_f32(l_b - l) : 0.0f};
}

/// One output element of a merge step: o_a untouched, o_b copied, or fma(w_a, o_a, w_b · o_b).
CPD_HD float merge_value(const MergeWeights& w, float o_a, float o_b) {
  if (w.mode == MergeWeights::keep_a) return o_a;
  if (w.mode == MergeWeights::take_b) return o_b;
  return fma_f32(w.w_a, o_a, w.w_b * o_b);
}

/// Merges state b into state a in place: a ← merge(a, b) (design §3). A state with lse = -inf
/// is the identity and leaves the other state's bits untouched (so skipping a fully masked
/// block and merging it are the same bits). Non-finite l (only from NaN/inf inputs) gives zero
/// weights, as the contract says; the lse carries the failure.
CPD_HD void merge_state_row(float* o_a, float* l_a, const float* o_b, float l_b, int dim) {
  const MergeWeights w = merge_weights(*l_a, l_b);
  for (int d = 0; d < dim; ++d) o_a[d] = merge_value(w, o_a[d], o_b[d]);
  *l_a = w.lse;
}

}  // namespace cpd
