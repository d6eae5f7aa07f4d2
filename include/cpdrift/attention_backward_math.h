// The canonical FP32 attention backward (design §3, docs/numerics.md §6), one block pair at a
// time: the definition fast kernels are tested against bit for bit.
//
// The query and KV sequences share one global block grid. For a query block qb and a KV block
// kb that the causal mask does not empty (kb.begin < qb.end), the visible pairs (j ≤ i) enter:
//
//   s_ij  = dot_seq(q_i, k_j) · scale
//   P_ij  = exp(s_ij - lse_i)            (lse: the merged forward lse)
//   dP_ij = dot_seq(dO_i, v_j)
//   dS_ij = P_ij · (dP_ij - Δ_i)          Δ_i = dot_seq(dO_i, out_i)
//   dq_i^(kb)  = sequential over visible j ∈ kb ascending:  acc = fma(dS_ij, k_j, acc)   (from +0)
//   dk_j^(qb)  = sequential over visible i ∈ qb ascending:  acc = fma(dS_ij, q_i, acc)   (from +0)
//   dv_j^(qb)  = sequential over visible i ∈ qb ascending:  acc = fma(P_ij, dO_i, acc)   (from +0)
//
// Query and KV blocks come from the same grid, so in a non-empty pair every row sees a key
// and every key is seen by a row: no partial is empty.
//
// Totals: dQ_i = scale · fold_kb dq_i^(kb); dK_j = scale · fold_h fold_qb dk_j^(qb, h);
// dV_j = fold_h fold_qb dv_j^(qb, h): folds in ascending block index (then ascending query head
// of the GQA group), starting from the first term (t = x0; t = t + x1; …).
#pragma once

#include <cstdint>

#include "cpdrift/attention_math.h"

namespace cpd {

/// Δ_i = rowsum(dO_i ∘ out_i) as a sequential fma chain.
CPD_HD float backward_delta(const float* d_out, const float* out, int dim) {
  return dot_seq(d_out, out, dim);
}

/// P_ij and dS_ij of one visible (row, key) pair.
CPD_HD void backward_pair(const float* q, const float* k, const float* d_out, const float* v,
                          float scale, float lse, float delta, int dim, float* p, float* ds) {
  *p = exp_f32(dot_seq(q, k, dim) * scale - lse);
  *ds = *p * (dot_seq(d_out, v, dim) - delta);
}

/// Partial gradients of one (query block, KV block) pair for one head, the canonical way.
/// Rows: positions q_first …, nq of them, with q/d_out [nq][dim], lse/delta [nq]; keys:
/// positions k_first …, nk of them, with k/v [nk][dim]. Outputs (overwritten, from +0):
/// dq [nq][dim], dk [nk][dim], dv [nk][dim].
CPD_HD void backward_block_pair(const float* q, const float* d_out, const float* lse,
                                const float* delta, std::int64_t q_first, int nq, const float* k,
                                const float* v, std::int64_t k_first, int nk, int dim, float scale,
                                float* dq, float* dk, float* dv) {
  for (int x = 0; x < nq * dim; ++x) dq[x] = 0.0f;
  for (int x = 0; x < nk * dim; ++x) dk[x] = 0.0f;
  for (int x = 0; x < nk * dim; ++x) dv[x] = 0.0f;
  for (int i = 0; i < nq; ++i) {
    for (int j = 0; j < nk && k_first + j <= q_first + i; ++j) {
      float p, ds;
      backward_pair(q + i * dim, k + j * dim, d_out + i * dim, v + j * dim, scale, lse[i], delta[i],
                    dim, &p, &ds);
      for (int d = 0; d < dim; ++d) {
        dq[i * dim + d] = fma_f32(ds, k[j * dim + d], dq[i * dim + d]);
        dk[j * dim + d] = fma_f32(ds, q[i * dim + d], dk[j * dim + d]);
        dv[j * dim + d] = fma_f32(p, d_out[i * dim + d], dv[j * dim + d]);
      }
    }
  }
}

}  // namespace cpd
