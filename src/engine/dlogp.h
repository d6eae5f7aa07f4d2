// The logprob side (design §3): selected-token logprobs of the candidate attention output and
// of the reference through a synthetic FP32 lm_head, the heads' partial logits folded along the
// TP ranks in ascending head order.
#pragma once

#include <vector>

#include "engine/protocol.h"
#include "kernels/input_store.h"

namespace cpd {

/// Logprobs of the target tokens held by one token owner (TP rank 0 of a CP rank), shape
/// [B][1][its tokens][1].
struct TokenLogprobs {
  LogicalRank rank;
  Shard candidate, reference;
  /// Per token, KL(π_reference ‖ π_candidate) over the whole vocabulary (logprob_math.h's
  /// kl_divergence of the two logit rows), rounded to FP32.
  Shard kl;
};

/// A chunk `tokens` of `lp`'s owner: its logprobs at the targets (and the per-token KL) from
/// the logits of the whole vocabulary, [2][B][rows][vocab] (candidate, reference). Tokens are
/// independent: the pool takes blocks of them, the arithmetic of each the same on any thread.
void chunk_logprobs(const Problem& p, const Range& tokens, const float* z, int vocab,
                    TokenLogprobs& lp, ThreadPool& pool);

/// `candidate`, `reference`: per hosted rank (hosted_ranks order), the attention outputs the
/// hidden states come from (the BF16 CP output; the FP32 CP=1 output cast to BF16). Each rank
/// projects its heads through the store's lm_head and folds their partial logits, in ascending
/// head order, into a chunk's logits that pass along the TP ranks of its CP rank from the token
/// owner and back (dlogp_steps), where log_softmax is taken at the target. In steps of token
/// chunks (logit_chunks), so a rank holds a chunk's logits at a time whatever the vocabulary.
/// Collective.
std::vector<TokenLogprobs> run_dlogp(const CaseGrid& grid,
                                     const std::vector<const AttnShard*>& candidate,
                                     const std::vector<const AttnShard*>& reference, int vocab,
                                     Transport& transport, InputStore& store);

}  // namespace cpd
