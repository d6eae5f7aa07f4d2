// The attention layer's arithmetic around the core (docs/numerics.md §11): the canonical FP32
// order of each reduction the layer adds, so that a TP or CP split — which only decides where a
// piece runs — cannot change a bit.
//
//   projection  y[o] = dot_seq(x, W[o, 0 … in)) (+ b[o], one add after the chain): each output
//               one sequential fma chain over the whole reduction dim, however many rows a call
//               holds and however TP splits the outputs (no shape-dependent split-K).
//   head norm   ss = dot_seq(x, x, D); r = 1 / sqrt(ss / D + eps); y[d] = w[d] · (x[d] · r)
//               (transformers' RMSNorm over one head's D values, FP32 throughout).
//   o_proj      the sum over Hq·D columns cut into Hkv head groups of G = (Hq / Hkv)·D columns
//               (one KV group's query heads; every valid TP holds whole groups):
//               p_g[o] = dot_seq(a[g·G …], W_o[o, g·G …], G), out[o] = ((p_0 + p_1) + …) + p_last,
//               the running sum passed from TP rank to TP rank in ascending group order.
//   token sums  dW = ((P_0 + P_1) + …), P_b one fma chain over token block b's tokens; blocks of
//               layer_token_block(S) tokens, batch-major, folded in ascending order.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpdrift/attention_math.h"
#include "cpdrift/hd.h"

namespace cpd {

/// One output row of a projection: y[o] = dot_seq(x, w + o·ldw, in), then + bias[o] when
/// `bias` is not null, for o < outputs. `w` is the weight in Hugging Face's [out][in] layout
/// (row stride `ldw`), already offset to the first output row of the call.
CPD_HD void project_row(const float* x, const float* w, std::int64_t ldw, int in, int outputs,
                        const float* bias, float* y) {
  for (int o = 0; o < outputs; ++o) {
    const float acc = dot_seq(x, w + o * ldw, in);
    y[o] = bias ? acc + bias[o] : acc;
  }
}

/// RMSNorm of one head's `dim` values (Qwen3's q_norm and k_norm): y[d] = w[d]·(x[d]·r),
/// r = 1 / sqrt(dot_seq(x, x)/dim + eps), each operation one FP32 rounding (IEEE sqrt and
/// division: exact on the host and, without fast-math, in CUDA). `y` may be `x`.
CPD_HD void head_rms_norm(const float* x, const float* w, int dim, float eps, float* y) {
  const float mean = dot_seq(x, x, dim) / static_cast<float>(dim);
  const float r = 1.0f / sqrtf(mean + eps);
  for (int d = 0; d < dim; ++d) y[d] = w[d] * (x[d] * r);
}

/// o_proj's fold over head groups, continued: out[o] = ((out[o] + p_g0[o]) + p_g0+1[o]) + … for
/// groups [g0, g1) of `attn` (one token's Hq·D attention output, heads in order; only these
/// groups' columns are read). With `first`, group g0's partial is stored instead of added: the
/// rank holding group 0 starts the running sum, each next TP rank continues it.
CPD_HD void o_proj_groups(const float* attn, const float* w_o, std::int64_t ldw, int group_width,
                          int g0, int g1, int outputs, bool first, float* out) {
  for (int o = 0; o < outputs; ++o) {
    float acc = first ? 0.0f : out[o];  // `out` is not read when this rank starts the sum
    for (int g = g0; g < g1; ++g) {
      const std::int64_t c = std::int64_t{g} * group_width;
      const float p = dot_seq(attn + c, w_o + o * ldw + c, group_width);
      acc = first && g == g0 ? p : acc + p;
    }
    out[o] = acc;
  }
}

/// The weight gradients' token-block size (numerics.md §11): the largest power of two up to 256
/// dividing seq_len / 16, so that no block straddles two CP ranks at CP ≤ 8 in either layout.
/// A function of S alone: 0 when S is not a positive multiple of 16 (the layer refuses it).
CPD_HD std::int64_t layer_token_block(std::int64_t seq_len) {
  if (seq_len < 16 || seq_len % 16 != 0) return 0;
  std::int64_t block = 1;
  while (block < 256 && (seq_len / 16) % (block * 2) == 0) block *= 2;
  return block;
}

/// One token block's partial of a weight gradient: p[o][i] = one fma chain over the block's
/// tokens t ascending from +0 of dy[t][o]·x[t][i], for o < outputs, i < inputs (`dy` rows of
/// `ld_dy`, `x` rows of `ld_x` floats, already offset to the block's first token).
CPD_HD void token_block_partial(const float* dy, std::int64_t ld_dy, const float* x,
                                std::int64_t ld_x, std::int64_t tokens, int outputs, int inputs,
                                float* p) {
  for (int o = 0; o < outputs; ++o) {
    for (int i = 0; i < inputs; ++i) {
      float acc = 0.0f;
      for (std::int64_t t = 0; t < tokens; ++t)
        acc = fma_f32(dy[t * ld_dy + o], x[t * ld_x + i], acc);
      p[o * inputs + i] = acc;
    }
  }
}

/// The fold of block partials in ascending block order: running = running + p (or, for the
/// grid's first block, running = p), element by element.
CPD_HD void fold_token_block(const float* p, std::int64_t n, bool first, float* running) {
  for (std::int64_t e = 0; e < n; ++e) running[e] = first ? p[e] : running[e] + p[e];
}

}  // namespace cpd
