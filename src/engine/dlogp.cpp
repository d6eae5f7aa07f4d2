#include "cpdrift/engine/dlogp.h"

#include <algorithm>
#include <map>

#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/cpu/inputs.h"
#include "cpdrift/numerics/logprob_math.h"
#include "protocol_common.h"

namespace cpd {
namespace {

// Per-head partial logits of one rank's token range: [2][B][heads][rows][vocab] for the
// candidate then the reference.
std::vector<float> partial_logits(const CaseGrid& grid, const LogicalRank& r, const Range& tokens,
                                  const AttnShard& cand, const AttnShard& ref,
                                  const std::vector<float>& w, int vocab,
                                  AttentionBackend& backend) {
  const int dim = grid.problem.dims.head_dim, batch = grid.problem.batch;
  const std::int64_t heads = r.q_heads.size(), rows = tokens.size(), ldw = heads * dim;
  std::vector<float> z(static_cast<std::size_t>(2 * batch * heads * rows * vocab));
  const std::int64_t first = cand.out.shape.local_row(tokens.begin);
  std::vector<ProjectionJob> jobs;
  for (int which = 0; which < 2; ++which) {
    const AttnShard& src = which == 0 ? cand : ref;
    for (int b = 0; b < batch; ++b) {
      for (std::int64_t hl = 0; hl < heads; ++hl) {
        jobs.push_back(ProjectionJob{src.out.at(b, r.q_heads.begin + hl, first), rows,
                                     w.data() + hl * dim, ldw,
                                     z.data() + ((which * batch + b) * heads + hl) * rows * vocab});
      }
    }
  }
  backend.project_heads(jobs, dim, vocab);
  return z;
}

}  // namespace

std::vector<TokenLogprobs> run_dlogp(const CaseGrid& grid,
                                     const std::vector<const AttnShard*>& candidate,
                                     const std::vector<const AttnShard*>& reference, int vocab,
                                     Transport& transport, AttentionBackend& backend) {
  const Problem& p = grid.problem;
  const int dim = p.dims.head_dim, batch = p.batch;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);

  // Partials of every hosted rank; TP ranks > 0 send theirs to their token owner.
  std::map<int, std::vector<std::vector<float>>> own;  // per hosted rank, per token range
  std::vector<Message> outgoing;
  for (std::size_t i = 0; i < hosted.size(); ++i) {
    const LogicalRank& r = hosted[i];
    const std::vector<float> w =
        lm_head_columns(p, vocab, Range{r.q_heads.begin * dim, r.q_heads.end * dim});
    for (const Range& t : r.tokens) {
      std::vector<float> z =
          partial_logits(grid, r, t, *candidate[i], *reference[i], w, vocab, backend);
      if (r.tp_rank == 0) {
        own[r.id].push_back(std::move(z));
        continue;
      }
      const LogicalRank& owner = grid.at(0, r.cp_rank);
      for (const MessageHeader& h : expected_logit_partials(grid, owner, vocab)) {
        if (h.src == r.id && h.tokens() == t) outgoing.push_back(Message{h, std::move(z)});
      }
    }
  }
  std::map<int, Inbox> inboxes = protocol::superstep(
      transport, hosted, std::move(outgoing),
      [&](const LogicalRank& r) { return expected_logit_partials(grid, r, vocab); });

  std::vector<TokenLogprobs> result;
  for (const LogicalRank& r : hosted) {
    if (r.tp_rank != 0) continue;
    const ShardShape shape{batch, Range{0, 1}, r.tokens, 1};
    TokenLogprobs lp{r, Shard(shape), Shard(shape), Shard(shape)};
    for (std::size_t ti = 0; ti < r.tokens.size(); ++ti) {
      const Range& t = r.tokens[ti];
      // The token range's partials from every TP rank, in ascending head order.
      struct Source {
        std::int64_t head_begin, heads;
        const float* z;
      };
      std::vector<Source> sources{{r.q_heads.begin, r.q_heads.size(), own.at(r.id)[ti].data()}};
      for (const Message& m : inboxes.at(r.id).messages()) {
        if (m.header.tokens() == t)
          sources.push_back({m.header.head_begin, m.header.heads().size(), m.payload.data()});
      }
      std::sort(sources.begin(), sources.end(),
                [](const Source& a, const Source& b) { return a.head_begin < b.head_begin; });
      const std::int64_t rows = t.size();
      std::vector<float> logits[2] = {std::vector<float>(static_cast<std::size_t>(vocab)),
                                      std::vector<float>(static_cast<std::size_t>(vocab))};
      std::vector<const float*> heads;  // the token's partials, ascending head order
      for (int b = 0; b < batch; ++b) {
        for (std::int64_t i = 0; i < rows; ++i) {
          const std::int64_t pos = t.begin + i, row = shape.local_row(pos);
          const int target = logprob_target(b, pos, p.seq_len, vocab);
          for (int which = 0; which < 2; ++which) {
            heads.clear();
            for (const Source& s : sources) {
              for (std::int64_t hl = 0; hl < s.heads; ++hl) {
                heads.push_back(s.z + (((which * batch + b) * s.heads + hl) * rows + i) * vocab);
              }
            }
            fold_head_logits(heads.data(), static_cast<int>(heads.size()), vocab,
                             logits[which].data());
            Shard& out = which == 0 ? lp.candidate : lp.reference;
            out.at(b, 0, row)[0] = log_softmax_at(logits[which].data(), vocab, target);
          }
          lp.kl.at(b, 0, row)[0] =
              static_cast<float>(kl_divergence(logits[1].data(), logits[0].data(), vocab));
        }
      }
    }
    result.push_back(std::move(lp));
  }
  return result;
}

}  // namespace cpd
