#include "engine/dlogp.h"

#include <algorithm>
#include <map>

#include "core/util/work_timers.h"
#include "cpdrift/logprob_math.h"
#include "engine/protocol_common.h"
#include "engine/tp_chain.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/logprob_rows.h"
#include "kernels/input_store.h"

namespace cpd {
namespace {

// One rank's step of a token chunk's logits, [2][B][rows][vocab] for the candidate then the
// reference: its heads' partials through their columns of the lm_head, folded in ascending
// order into `z` as they come out of the projection. The token owner (TP rank 0, the lowest
// heads) starts the fold in a buffer of an earlier step or a new one (every element is written,
// so neither is cleared); each next TP rank continues the plane the one before it sent.
FloatBuffer fold_own_heads(const CaseGrid& grid, const LogicalRank& r, const Range& tokens,
                           const AttnShard& cand, const AttnShard& ref, int vocab,
                           InputStore& store, FloatBuffer z, bool continues) {
  const int dim = grid.problem.dims.head_dim, batch = grid.problem.batch;
  const std::int64_t rows = tokens.size(), plane = rows * vocab;
  if (!continues) {
    z.resize(static_cast<std::size_t>(2 * batch * plane));
    mark_unwritten(z);
  }
  const std::int64_t first = cand.out.shape.local_row(tokens.begin);
  std::vector<FoldedProjectionJob> folds;
  for (int which = 0; which < 2; ++which) {
    const AttnShard& src = which == 0 ? cand : ref;
    for (int b = 0; b < batch; ++b) {
      FoldedProjectionJob fold{{}, z.data() + (which * batch + b) * plane, continues};
      for (std::int64_t h = r.q_heads.begin; h < r.q_heads.end; ++h) {
        fold.heads.push_back(ProjectionJob{src.out.at(b, h, first), rows,
                                           store.lm_head(vocab, h).data(), dim, nullptr});
      }
      folds.push_back(std::move(fold));
    }
  }
  store.backend().project_folded(folds, dim, vocab);
  return z;
}

}  // namespace

void chunk_logprobs(const Problem& p, const Range& t, const float* z, int vocab, TokenLogprobs& lp,
                    ThreadPool& pool) {
  const WorkTimer timer(WorkKind::logprobs);
  constexpr std::int64_t kTokensPerTask = 16;
  const std::int64_t rows = t.size(), blocks = (rows + kTokensPerTask - 1) / kTokensPerTask;
  const ShardShape& shape = lp.candidate.shape;
  pool.parallel_for(p.batch * blocks, [&](std::int64_t task) {
    const int b = static_cast<int>(task / blocks);
    const std::int64_t first = task % blocks * kTokensPerTask;
    for (std::int64_t i = first; i < std::min(rows, first + kTokensPerTask); ++i) {
      const std::int64_t pos = t.begin + i, row = shape.local_row(pos);
      const int target = logprob_target(b, pos, p.seq_len, vocab);
      const float* logits[2];
      for (int which = 0; which < 2; ++which) {
        logits[which] = z + ((which * p.batch + b) * rows + i) * vocab;
        Shard& out = which == 0 ? lp.candidate : lp.reference;
        out.at(b, 0, row)[0] = log_softmax_at_lanes(logits[which], vocab, target);
      }
      lp.kl.at(b, 0, row)[0] = static_cast<float>(kl_divergence(logits[1], logits[0], vocab));
    }
  });
}

std::vector<TokenLogprobs> run_dlogp(const CaseGrid& grid,
                                     const std::vector<const AttnShard*>& candidate,
                                     const std::vector<const AttnShard*>& reference, int vocab,
                                     Transport& transport, InputStore& store) {
  const Problem& p = grid.problem;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  std::vector<TokenLogprobs> result;
  std::map<std::size_t, std::size_t> owned;  // hosted index of a token owner -> its result
  for (std::size_t i = 0; i < hosted.size(); ++i) {
    const LogicalRank& r = hosted[i];
    if (r.tp_rank != 0) continue;
    const ShardShape shape{p.batch, Range{0, 1}, r.tokens, 1};
    owned[i] = result.size();
    result.push_back(TokenLogprobs{r, Shard(shape), Shard(shape), Shard(shape)});
  }
  // The owner (TP rank 0) starts the fold of a chunk's logits with its heads, each next TP rank
  // continues the plane with its heads, and the owner takes the logprobs of the finished plane.
  run_tp_chain(
      grid, logit_chain(grid, vocab), transport, hosted,
      [&](std::size_t i, const Range& chunk, FloatBuffer z, bool continues) {
        return fold_own_heads(grid, hosted[i], chunk, *candidate[i], *reference[i], vocab, store,
                              std::move(z), continues);
      },
      [&](std::size_t i, const Range& chunk, const FloatBuffer& z) {
        chunk_logprobs(p, chunk, z.data(), vocab, result[owned.at(i)], store.pool());
      });
  return result;
}

}  // namespace cpd
