// The host's selected-token logprob on 16 lanes (src/kernels/cpu/logprob_rows.h).
#include "kernels/cpu/logprob_rows.h"

#include "cpdrift/fmath.h"
#include "cpdrift/logprob_math.h"
#include "kernels/cpu/simd16_math.h"

namespace cpd {
namespace {

constexpr int kLanes = 16;

}  // namespace

float log_softmax_at_lanes(const float* logits, int vocab, int target) {
  const float m = max_in_order_by_lanes(logits, vocab);
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
