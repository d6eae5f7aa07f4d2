// The merges of the production stacks users run, emulated bit for bit in cpdrift's arithmetic
// (docs/numerics.md §10): the order in which each system combines the per-rank attention
// states of one query row, and the precision it holds them in. The canonical grid merges
// block states in ascending global block index in FP32 (attention_math.h); these do not.
#pragma once

#include <array>
#include <cstdint>

#include "cpdrift/attention_math.h"
#include "cpdrift/enum_names.h"

namespace cpd {

enum class ProductionLane : std::uint8_t {
  te_p2p,     // Transformer Engine's P2P ring: ring order, BF16 running output
  ring_fp32,  // ring-flash-attention: ring order, FP32 running output (sigmoid update)
  nccl_rs,    // vLLM decode CP: BF16 rescale, then a ring reduce-scatter's BF16 sums
};

inline constexpr std::array<ProductionLane, 3> kProductionLanes{
    ProductionLane::te_p2p, ProductionLane::ring_fp32, ProductionLane::nccl_rs};

inline constexpr EnumName<ProductionLane> kProductionLaneNames[] = {
    {ProductionLane::te_p2p, "te_p2p"},
    {ProductionLane::ring_fp32, "ring_fp32"},
    {ProductionLane::nccl_rs, "nccl_rs"},
};
inline const char* to_string(ProductionLane l) { return name_of(kProductionLaneNames, l); }

/// One CP rank's attention state for one query row, as its kernel call wrote it: the row
/// against all of that rank's keys it can see, `out` rounded to BF16, `lse` FP32; `lse = -inf`
/// (and `out` all zeros) when the row sees none of them.
struct RankState {
  const float* out = nullptr;
  float lse = 0.0f;
};

/// Every CP rank's state of one query row, CP rank s's at [s]: a view of a contiguous array
/// (a std::vector, a std::span, a pointer and a count).
class RankStates {
 public:
  RankStates(const RankState* states, int cp) : states_(states), cp_(cp) {}
  template <class Contiguous>
  RankStates(const Contiguous& c) : states_(c.data()), cp_(static_cast<int>(c.size())) {}
  int size() const { return cp_; }
  const RankState& operator[](int s) const { return states_[s]; }
  const RankState* begin() const { return states_; }
  const RankState* end() const { return states_ + cp_; }

 private:
  const RankState* states_;
  int cp_;
};

/// The CP rank whose K/V a ring holds at step `step` on rank `owner`: (owner − step) mod cp.
inline int ring_source(int owner, int step, int cp) { return ((owner - step) % cp + cp) % cp; }

/// Transformer Engine's backward ring ("in reversed order of fwd"): it starts from the K/V the
/// forward ended with and passes them (with their dK/dV) to rank − 1, so at step `step` rank
/// `owner` holds the K/V of rank (owner + 1 + step) mod cp — the diagonal last.
inline int te_backward_kv_source(int owner, int step, int cp) { return (owner + 1 + step) % cp; }

/// The query rank that adds to KV rank `kv_rank`'s travelling dK/dV at backward step `step`:
/// the rank holding it then, (kv_rank − 1 − step) mod cp — its own queries last.
inline int te_backward_dkv_visitor(int kv_rank, int step, int cp) {
  return ((kv_rank - 1 - step) % cp + cp) % cp;
}

/// Transformer Engine: the LSE folded in ring order (max + log1p(exp(min − max)), FP32), then
/// the output corrected step by step in ring order into a BF16 running output:
/// out = bf16(o_s · exp(l_s − L)) for the first step, out = bf16(out + o_s · exp(l_s − L)).
inline void te_p2p_row(RankStates by_rank, int owner, int dim, float* out, float* lse) {
  const int cp = by_rank.size();
  float total = neg_inf_f32();
  for (int i = 0; i < cp; ++i) total = logaddexp_f32(total, by_rank[ring_source(owner, i, cp)].lse);
  bool first = true;
  for (int i = 0; i < cp; ++i) {
    const RankState& s = by_rank[ring_source(owner, i, cp)];
    if (s.lse == neg_inf_f32()) continue;  // the ring step that holds no visible key is skipped
    const float w = exp_f32(s.lse - total);
    for (int d = 0; d < dim; ++d) {
      const float corrected = s.out[d] * w;
      out[d] = round_bf16(first ? corrected : out[d] + corrected);
    }
    first = false;
  }
  if (first) {
    for (int d = 0; d < dim; ++d) out[d] = 0.0f;
  }
  *lse = total;
}

/// ring-flash-attention's `_update_out_and_lse`: in ring order, the first state widened to
/// FP32, then out = out − sigmoid(l_s − lse) · (out − o_s), lse = lse − logsigmoid(lse − l_s),
/// all FP32 (sigmoid(x) = 1 / (1 + exp(−x)); logsigmoid(x) = min(x, 0) − log1p(exp(−|x|))); the
/// final write rounds out to BF16.
inline void ring_fp32_row(RankStates by_rank, int owner, int dim, float* out, float* lse) {
  const int cp = by_rank.size();
  bool first = true;
  float l = neg_inf_f32();
  for (int i = 0; i < cp; ++i) {
    const RankState& s = by_rank[ring_source(owner, i, cp)];
    if (s.lse == neg_inf_f32()) continue;
    if (first) {
      for (int d = 0; d < dim; ++d) out[d] = s.out[d];
      l = s.lse;
      first = false;
      continue;
    }
    const float sig = 1.0f / (1.0f + exp_f32(-(s.lse - l)));
    for (int d = 0; d < dim; ++d) out[d] = out[d] - sig * (out[d] - s.out[d]);
    const float x = l - s.lse;
    const float ax = x < 0.0f ? -x : x;
    const float log_sigmoid = (x < 0.0f ? x : 0.0f) - log1p_f32(exp_f32(-ax));
    l = l - log_sigmoid;
  }
  for (int d = 0; d < dim; ++d) out[d] = first ? 0.0f : round_bf16(out[d]);
  *lse = l;
}

/// vLLM's decode-CP merge (`cp_lse_ag_out_rs`): the all-gathered LSEs combined as
/// log(Σ_s exp(l_s − max)) + max (the sum in rank order; max 0 when every l is −inf), each
/// rank's output rescaled into BF16, bf16(o_s · exp(l_s − L)), then summed by a ring
/// reduce-scatter: the chunk of rank `owner` starts at rank owner+1 and every hop adds its own
/// chunk in BF16, ending at the owner: bf16(…bf16(bf16(x_{r+1} + x_{r+2}) + …) + x_r). A row
/// that sees no key at all gives the identity (out 0, lse −inf).
inline void nccl_rs_row(RankStates by_rank, int owner, int dim, float* out, float* lse) {
  const int cp = by_rank.size();
  float top = neg_inf_f32();
  for (const RankState& s : by_rank) top = s.lse > top ? s.lse : top;
  if (top == neg_inf_f32()) top = 0.0f;
  float sum = 0.0f;
  for (const RankState& s : by_rank) sum = sum + exp_f32(s.lse - top);
  const float total = log_f32(sum) + top;
  if (total == neg_inf_f32()) {
    for (int d = 0; d < dim; ++d) out[d] = 0.0f;
    *lse = total;
    return;
  }
  for (int k = 1; k <= cp; ++k) {
    const RankState& s = by_rank[(owner + k) % cp];
    const float w = exp_f32(s.lse - total);
    for (int d = 0; d < dim; ++d) {
      const float scaled = round_bf16(s.out[d] * w);
      out[d] = k == 1 ? scaled : round_bf16(out[d] + scaled);
    }
  }
  *lse = total;
}

/// The row of `lane` from the per-rank states (`by_rank[s]`: CP rank s's) at query owner `owner`.
inline void production_row(ProductionLane lane, RankStates by_rank, int owner, int dim, float* out,
                           float* lse) {
  switch (lane) {
    case ProductionLane::te_p2p:
      return te_p2p_row(by_rank, owner, dim, out, lse);
    case ProductionLane::ring_fp32:
      return ring_fp32_row(by_rank, owner, dim, out, lse);
    case ProductionLane::nccl_rs:
      return nccl_rs_row(by_rank, owner, dim, out, lse);
  }
}

}  // namespace cpd
