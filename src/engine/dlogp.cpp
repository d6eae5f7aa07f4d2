#include "engine/dlogp.h"

#include <algorithm>
#include <map>

#include "core/util/work_timers.h"
#include "cpdrift/logprob_math.h"
#include "engine/protocol_common.h"
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

// The chunk's logprobs (and per-token KL) at the token owner, from its logits folded over every
// head ([2][B][rows][vocab]). Tokens are independent: the pool takes blocks of them, and every
// token's arithmetic is the same whichever thread runs it.
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

}  // namespace

std::vector<TokenLogprobs> run_dlogp(const CaseGrid& grid,
                                     const std::vector<const AttnShard*>& candidate,
                                     const std::vector<const AttnShard*>& reference, int vocab,
                                     Transport& transport, InputStore& store) {
  const Problem& p = grid.problem;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  std::map<int, std::vector<Range>> chunks;
  std::vector<TokenLogprobs> result;
  for (const LogicalRank& r : hosted) {
    chunks[r.id] = logit_chunks(grid, r, vocab);
    if (r.tp_rank != 0) continue;
    const ShardShape shape{p.batch, Range{0, 1}, r.tokens, 1};
    result.push_back(TokenLogprobs{r, Shard(shape), Shard(shape), Shard(shape)});
  }

  // A chain per CP rank: in step s, TP rank t works on its chunk s - t. The owner (t = 0) starts
  // the fold of the chunk's logits with its heads, each next TP rank continues the plane the one
  // before it sent in the last step with its heads, and the last sends it back to the owner,
  // which takes the logprobs at the end of the step. One plane travels a hop, not every head's.
  const int tp = grid.spec.tp, steps = dlogp_steps(grid, vocab);
  std::vector<FloatBuffer> spare;  // consumed planes, reused by the owners
  std::map<int, Inbox> received;   // what each hosted rank got in the last step
  for (int step = 0; step < steps; ++step) {
    std::vector<Message> outgoing;
    std::map<int, FloatBuffer> finished;  // TP = 1: the owner's own plane, complete
    for (std::size_t i = 0; i < hosted.size(); ++i) {
      const LogicalRank& r = hosted[i];
      const std::vector<Range>& mine = chunks.at(r.id);
      const int chunk = step - r.tp_rank;
      if (chunk < 0 || chunk >= static_cast<int>(mine.size())) continue;
      FloatBuffer z;
      if (r.tp_rank > 0) {
        // The plane holds the fold of exactly the heads below this rank's (manifest.cpp).
        z = std::move(received.at(r.id).take_messages().at(0).payload);
      } else if (!spare.empty()) {
        z = std::move(spare.back());
        spare.pop_back();
      }
      z = fold_own_heads(grid, r, mine[static_cast<std::size_t>(chunk)], *candidate[i],
                         *reference[i], vocab, store, std::move(z), r.tp_rank > 0);
      if (tp == 1) {
        finished[r.id] = std::move(z);
        continue;
      }
      const LogicalRank& next = grid.at((r.tp_rank + 1) % tp, r.cp_rank);
      for (const MessageHeader& h : expected_logit_partials(grid, next, vocab, step)) {
        if (h.src == r.id) outgoing.push_back(Message{h, std::move(z)});
      }
    }
    received = protocol::superstep(
        transport, hosted, std::move(outgoing),
        [&](const LogicalRank& r) { return expected_logit_partials(grid, r, vocab, step); });
    for (TokenLogprobs& lp : result) {
      const LogicalRank& r = lp.rank;
      const int chunk = step - (tp - 1);
      if (chunk < 0 || chunk >= static_cast<int>(chunks.at(r.id).size())) continue;
      FloatBuffer z = tp == 1 ? std::move(finished.at(r.id))
                              : std::move(received.at(r.id).take_messages().at(0).payload);
      chunk_logprobs(p, chunks.at(r.id)[static_cast<std::size_t>(chunk)], z.data(), vocab, lp,
                     store.pool());
      spare.push_back(std::move(z));
    }
  }
  return result;
}

}  // namespace cpd
