// The host's selected-token logprob on 16 lanes: bit for bit logprob_math.h's log_softmax_at.
#pragma once

namespace cpd {

/// log_softmax(logits)[target], the same bits as log_softmax_at: the maximum found 16 lanes at
/// a time (two floats that compare equal are the same bits, but for +0 and -0: a zero maximum
/// is found again in order, as the definition picks the first), the exps on 16 lanes (the
/// same exp_lanes sequence), their sum in order from +0.
float log_softmax_at_lanes(const float* logits, int vocab, int target);

}  // namespace cpd
