// The selected-token logprob (dlogp) arithmetic (design §3, docs/numerics.md §7).
//
// hidden[b, s, h·D + d] = out[b, h, s, d]; W[v, c] is the synthetic FP32 lm_head. The logit of
// token (b, s) and vocabulary entry v is a fold over heads in ascending order of per-head
// partials, so any TP split of the heads gives the same bits:
//
//   z_h[v]   = dot_seq(hidden[h·D … h·D+D), W[v, h·D … h·D+D))
//   logit[v] = ((z_0[v] + z_1[v]) + z_2[v]) + …
//   m = max_v logit (sequential), sum = sequential Σ_v exp(logit - m) from +0
//   logp[v] = logit[v] - (m + log(sum))
//
// The target of token (b, s) is (b·S + s) mod V; every token but each sequence's first is
// active.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpdrift/attention_math.h"
#include "cpdrift/fmath.h"

namespace cpd {

/// Per-head partial logits of one token: z[v] for v < vocab. `hidden` is the head's D values,
/// `w` the lm_head with row stride `ldw`, already offset to the head's first column.
CPD_HD void head_partial_logits(const float* hidden, const float* w, std::int64_t ldw, int dim,
                                int vocab, float* z) {
  for (int v = 0; v < vocab; ++v) z[v] = dot_seq(hidden, w + v * ldw, dim);
}

namespace detail {
// out[v] = (((out[v] + a[v]) + b[v]) + c[v]) + d[v]: four heads of the sequential fold in one
// pass. The rows are declared apart so that the loop vectorises; a fold a head at a time through
// `const float* const*` stayed scalar (the compiler could not rule out aliasing) and was bound by
// loading the partials one float at a time.
CPD_HD void add_four_heads(float* __restrict__ out, const float* __restrict__ a,
                           const float* __restrict__ b, const float* __restrict__ c,
                           const float* __restrict__ d, int n) {
  for (int v = 0; v < n; ++v) out[v] = (((out[v] + a[v]) + b[v]) + c[v]) + d[v];
}

CPD_HD void add_head(float* __restrict__ out, const float* __restrict__ a, int n) {
  for (int v = 0; v < n; ++v) out[v] = out[v] + a[v];
}
}  // namespace detail

/// logit[v] = ((logit[v] + z_0[v]) + z_1[v]) + …: the fold of earlier heads that `logits`
/// holds, continued with these heads' partials in ascending order (none of them in `logits`).
CPD_HD void continue_head_fold(const float* const* z, int heads, int vocab, float* logits) {
  int h = 0;
  for (; h + 4 <= heads; h += 4)
    detail::add_four_heads(logits, z[h], z[h + 1], z[h + 2], z[h + 3], vocab);
  for (; h < heads; ++h) detail::add_head(logits, z[h], vocab);
}

/// logit[v] = ((z_0[v] + z_1[v]) + …) + z_{heads-1}[v]: the heads' partial logits folded in
/// ascending head order (z[h] holds head h's `vocab` partials, none of them in `logits`).
CPD_HD void fold_head_logits(const float* const* z, int heads, int vocab, float* logits) {
  if (heads <= 0) return;
  for (int v = 0; v < vocab; ++v) logits[v] = z[0][v];
  continue_head_fold(z + 1, heads - 1, vocab, logits);
}

/// log_softmax(logits)[target] in FP32.
CPD_HD float log_softmax_at(const float* logits, int vocab, int target) {
  float m = neg_inf_f32();
  for (int v = 0; v < vocab; ++v) m = logits[v] > m ? logits[v] : m;
  float sum = 0.0f;
  for (int v = 0; v < vocab; ++v) sum = sum + exp_f32(logits[v] - m);
  return logits[target] - (m + log_f32(sum));
}

namespace detail {
// Σ_v term(v) for v < n, added in ascending order from +0. The terms are computed 64 at a time
// into a buffer first, so that their loop vectorises where term has no branches; the sum stays
// one addition at a time, in order.
template <class Term>
double sum_in_order(int n, Term&& term) {
  constexpr int kBatch = 64;
  double sum = 0;
  for (int v0 = 0; v0 < n; v0 += kBatch) {
    const int len = n - v0 < kBatch ? n - v0 : kBatch;
    double t[kBatch];
    for (int k = 0; k < len; ++k) t[k] = term(v0 + k);
    for (int k = 0; k < len; ++k) sum += t[k];
  }
  return sum;
}

}  // namespace detail

/// log_softmax_at's maximum, `m = -inf; m = z[v] > m ? z[v] : m` over v < n, with its bits,
/// taken in 16 partial maxima so that it vectorises. NaNs never win a `>`, and nonzero floats
/// that compare equal have the same bits, so the lanes give the same value; only the sign of a
/// zero maximum could differ, and that case is scanned again in order. Host only.
inline float max_in_order_by_lanes(const float* z, int n) {
  constexpr int kLanes = 16;
  float lane[kLanes];
  for (float& l : lane) l = neg_inf_f32();
  int v = 0;
  for (; v + kLanes <= n; v += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] = z[v + l] > lane[l] ? z[v + l] : lane[l];
  }
  float m = neg_inf_f32();
  for (const float l : lane) m = l > m ? l : m;
  for (; v < n; ++v) m = z[v] > m ? z[v] : m;
  if (m != 0.0f) return m;
  m = neg_inf_f32();
  for (v = 0; v < n; ++v) m = z[v] > m ? z[v] : m;
  return m;
}

/// KL(p ‖ q) = Σ_v p_v (log p_v − log q_v) over the whole vocabulary, p = softmax(p_logits),
/// q = softmax(q_logits), in FP64 (a measurement, not a path whose bits matter): the maxima and
/// the exps vectorised (max_in_order_by_lanes, exp_f64 of fmath.h, within 0.86 ulp), each sum in
/// ascending v. Host only.
inline double kl_divergence(const float* p_logits, const float* q_logits, int vocab) {
  const auto log_norm = [&](const float* z) {
    const double m = max_in_order_by_lanes(z, vocab);
    return m + std::log(detail::sum_in_order(
                   vocab, [&](int v) { return exp_f64(static_cast<double>(z[v]) - m); }));
  };
  const double lp = log_norm(p_logits), lq = log_norm(q_logits);
  return detail::sum_in_order(vocab, [&](int v) {
    const double log_p = p_logits[v] - lp, log_q = q_logits[v] - lq;
    return exp_f64(log_p) * (log_p - log_q);
  });
}

/// The target token of position s of sequence b.
CPD_HD int logprob_target(int b, std::int64_t s, std::int64_t seq_len, int vocab) {
  return static_cast<int>((static_cast<std::int64_t>(b) * seq_len + s) % vocab);
}

}  // namespace cpd
