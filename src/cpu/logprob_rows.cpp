// The host's selected-token logprob on 16 lanes (include/cpdrift/cpu/logprob_rows.h).
#include "cpdrift/cpu/logprob_rows.h"

#include "cpdrift/numerics/fmath.h"
#include "simd16_math.h"

namespace cpd {
namespace {

constexpr int kLanes = 16;

float max_in_order(const float* x, int n) {
  float m = neg_inf_f32();
  for (int v = 0; v < n; ++v) m = x[v] > m ? x[v] : m;
  return m;
}

// max_in_order's value: NaNs never win a `>`, and nonzero floats that compare equal have the
// same bits, so the lanes' maxima give it except for the sign of a zero maximum.
float max_of(const float* x, int n) {
  simd::F16 m16 = simd::splat(neg_inf_f32());
  int v = 0;
  for (; v + kLanes <= n; v += kLanes) {
    const simd::F16 xv = simd::load(x + v);
    m16 = simd::select(simd::gt(xv, m16), xv, m16);
  }
  alignas(64) float lanes[kLanes];
  simd::store(lanes, m16);
  float m = max_in_order(lanes, kLanes);
  for (; v < n; ++v) m = x[v] > m ? x[v] : m;
  return m == 0.0f ? max_in_order(x, n) : m;
}

}  // namespace

float log_softmax_at_lanes(const float* logits, int vocab, int target) {
  const float m = max_of(logits, vocab);
  const simd::F16 mv = simd::splat(m);
  float sum = 0.0f;
  int v = 0;
  for (; v + kLanes <= vocab; v += kLanes) {
    alignas(64) float e[kLanes];
    simd::store(e, simd::exp(simd::sub(simd::load(logits + v), mv)));
    for (const float x : e) sum = sum + x;
  }
  for (; v < vocab; ++v) sum = sum + exp_f32(logits[v] - m);
  return logits[target] - (m + log_f32(sum));
}

}  // namespace cpd
