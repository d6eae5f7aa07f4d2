#include "cpdrift/engine/dlogp.h"

#include <algorithm>
#include <map>

#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/backend/input_store.h"
#include "cpdrift/cpu/logprob_rows.h"
#include "cpdrift/numerics/logprob_math.h"
#include "cpdrift/util/work_timers.h"
#include "protocol_common.h"

namespace cpd {
namespace {

// One rank's logits of a token chunk, [2][B][heads][rows][vocab] for the candidate then the
// reference, each head's columns of the lm_head from the input store: per-head partials, or
// with `folded` (the token owner's own heads) those heads folded in ascending order into one
// plane per (which, b), as fold_head_logits would fold them. `z` is a buffer of an earlier step
// (or empty): every element is written, so a recycled buffer is not cleared, nor is a new one.
FloatBuffer partial_logits(const CaseGrid& grid, const LogicalRank& r, const Range& tokens,
                           const AttnShard& cand, const AttnShard& ref, int vocab, bool folded,
                           InputStore& store, FloatBuffer z) {
  const int dim = grid.problem.dims.head_dim, batch = grid.problem.batch;
  const std::int64_t heads = r.q_heads.size(), rows = tokens.size();
  const std::int64_t planes = folded ? std::min<std::int64_t>(heads, 1) : heads;
  z.resize(static_cast<std::size_t>(2 * batch * planes * rows * vocab));
  mark_unwritten(z);
  const std::int64_t first = cand.out.shape.local_row(tokens.begin);
  std::vector<ProjectionJob> jobs;
  std::vector<FoldedProjectionJob> folds;
  for (int which = 0; which < 2; ++which) {
    const AttnShard& src = which == 0 ? cand : ref;
    for (int b = 0; b < batch; ++b) {
      float* plane = z.data() + (which * batch + b) * planes * rows * vocab;
      if (folded) folds.push_back(FoldedProjectionJob{{}, plane});
      for (std::int64_t hl = 0; hl < heads; ++hl) {
        const ProjectionJob job{src.out.at(b, r.q_heads.begin + hl, first), rows,
                                store.lm_head(vocab, r.q_heads.begin + hl).data(), dim,
                                folded ? nullptr : plane + hl * rows * vocab};
        (folded ? folds.back().heads : jobs).push_back(job);
      }
    }
  }
  if (folded) {
    store.backend().project_folded(folds, dim, vocab);
  } else {
    store.backend().project_heads(jobs, dim, vocab);
  }
  return z;
}

// One token chunk's partials at its owner: each source's first head, its planes a (which, b)
// (one for the owner's heads, already folded) and their data.
struct Source {
  std::int64_t head_begin, planes;
  const float* z;
};

// The chunk's logprobs (and per-token KL) at the token owner, from every TP rank's partials
// folded in ascending head order. Tokens are independent: the pool takes blocks of them, each
// with its own two logit rows, and every token's arithmetic is the same whichever thread runs it.
void chunk_logprobs(const Problem& p, const Range& t, std::vector<Source> sources, int vocab,
                    TokenLogprobs& lp, ThreadPool& pool) {
  const WorkTimer timer(WorkKind::logprobs);
  constexpr std::int64_t kTokensPerTask = 16;
  std::sort(sources.begin(), sources.end(),
            [](const Source& a, const Source& b) { return a.head_begin < b.head_begin; });
  const std::int64_t rows = t.size(), blocks = (rows + kTokensPerTask - 1) / kTokensPerTask;
  const ShardShape& shape = lp.candidate.shape;
  pool.parallel_for(p.batch * blocks, [&](std::int64_t task) {
    const int b = static_cast<int>(task / blocks);
    const std::int64_t first = task % blocks * kTokensPerTask;
    std::vector<float> logits[2] = {std::vector<float>(static_cast<std::size_t>(vocab)),
                                    std::vector<float>(static_cast<std::size_t>(vocab))};
    std::vector<const float*> heads;  // the token's partials, ascending head order
    for (std::int64_t i = first; i < std::min(rows, first + kTokensPerTask); ++i) {
      const std::int64_t pos = t.begin + i, row = shape.local_row(pos);
      const int target = logprob_target(b, pos, p.seq_len, vocab);
      for (int which = 0; which < 2; ++which) {
        heads.clear();
        for (const Source& s : sources) {
          for (std::int64_t hl = 0; hl < s.planes; ++hl)
            heads.push_back(s.z + (((which * p.batch + b) * s.planes + hl) * rows + i) * vocab);
        }
        fold_head_logits(heads.data(), static_cast<int>(heads.size()), vocab, logits[which].data());
        Shard& out = which == 0 ? lp.candidate : lp.reference;
        out.at(b, 0, row)[0] = log_softmax_at_lanes(logits[which].data(), vocab, target);
      }
      lp.kl.at(b, 0, row)[0] =
          static_cast<float>(kl_divergence(logits[1].data(), logits[0].data(), vocab));
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

  // Step by step, one chunk of every rank's tokens: each hosted rank projects its heads; TP
  // ranks > 0 send their partials to the chunk's owner, which folds them with its own.
  const int steps = logit_steps(grid, vocab);
  std::vector<FloatBuffer> spare;  // the last step's partials, reused
  const auto recycled = [&spare] {
    FloatBuffer z;
    if (!spare.empty()) {
      z = std::move(spare.back());
      spare.pop_back();
    }
    return z;
  };
  for (int step = 0; step < steps; ++step) {
    std::map<int, FloatBuffer> own;  // per hosted token owner, its partials
    std::vector<Message> outgoing;
    for (std::size_t i = 0; i < hosted.size(); ++i) {
      const LogicalRank& r = hosted[i];
      const std::vector<Range>& mine = chunks.at(r.id);
      if (step >= static_cast<int>(mine.size())) continue;
      const Range& t = mine[static_cast<std::size_t>(step)];
      // The token owner folds its own heads (the lowest, TP rank 0's) as it projects them;
      // the other TP ranks' partials follow in ascending head order at the owner.
      FloatBuffer z = partial_logits(grid, r, t, *candidate[i], *reference[i], vocab,
                                     r.tp_rank == 0, store, recycled());
      if (r.tp_rank == 0) {
        own[r.id] = std::move(z);
        continue;
      }
      const LogicalRank& owner = grid.at(0, r.cp_rank);
      for (const MessageHeader& h : expected_logit_partials(grid, owner, vocab, step)) {
        if (h.src == r.id) outgoing.push_back(Message{h, std::move(z)});
      }
    }
    std::map<int, Inbox> inboxes = protocol::superstep(
        transport, hosted, std::move(outgoing),
        [&](const LogicalRank& r) { return expected_logit_partials(grid, r, vocab, step); });
    for (TokenLogprobs& lp : result) {
      const LogicalRank& r = lp.rank;
      if (own.count(r.id) == 0) continue;
      std::vector<Source> sources{
          {r.q_heads.begin, std::min<std::int64_t>(r.q_heads.size(), 1), own.at(r.id).data()}};
      for (const Message& m : inboxes.at(r.id).messages())
        sources.push_back({m.header.head_begin, m.header.heads().size(), m.payload.data()});
      chunk_logprobs(p, chunks.at(r.id)[static_cast<std::size_t>(step)], std::move(sources), vocab,
                     lp, store.pool());
    }
    for (auto& [id, z] : own) spare.push_back(std::move(z));
    for (auto& [id, inbox] : inboxes) {
      for (Message& m : inbox.take_messages()) spare.push_back(std::move(m.payload));
    }
    spare.resize(std::min(spare.size(), hosted.size()));  // no more than a step allocates
  }
  return result;
}

}  // namespace cpd
