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
    float acc = out[o];
    for (int g = g0; g < g1; ++g) {
      const std::int64_t c = std::int64_t{g} * group_width;
      const float p = dot_seq(attn + c, w_o + o * ldw + c, group_width);
      acc = first && g == g0 ? p : acc + p;
    }
    out[o] = acc;
  }
}

}  // namespace cpd
