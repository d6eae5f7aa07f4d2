// A paged lane's query rows across the processes: as published tensors, and through the
// synthetic lm_head to the target-token logprobs.
#include <algorithm>

#include "cpdrift/logprob_math.h"
#include "engine/paged/paged_lanes.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/inputs.h"
#include "kernels/cpu/logprob_rows.h"

namespace cpd::paged {

std::vector<int> head_owners(const Problem& p, int tp, int world) {
  std::vector<int> owner(static_cast<std::size_t>(p.dims.num_q_heads), 0);
  for (int r = 0; r < world; ++r) {
    const Range heads = kv_heads_of(p, tp, world, r);
    for (std::int64_t g = heads.begin; g < heads.end; ++g) {
      for (int x = 0; x < p.dims.group_size(); ++x)
        owner[static_cast<std::size_t>(g * p.dims.group_size() + x)] = r;
    }
  }
  return owner;
}

CaseTensor query_rows_tensor(const RunContext& ctx, const PagedWorkload& w, int tp,
                             std::string path, const Shard* local, int width, bool bf16,
                             bool digest) {
  const Problem& p = ctx.problem;
  const int world = ctx.collectives.size(), me = ctx.collectives.rank();
  const std::vector<int> owner = head_owners(p, tp, world);
  CaseTensor t;
  t.path = std::move(path);
  t.digest = digest;
  t.bf16 = bf16;
  t.layout = GlobalTensor{p.batch, p.dims.num_q_heads, w.q_len, width, {}, {}};
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.dims.num_q_heads; ++h) {
      const int proc = owner[static_cast<std::size_t>(h)];
      t.layout.add(GlobalPiece{b, h, Range{0, w.q_len}, proc},
                   proc == me ? local->at(b, h, 0) : nullptr);
    }
  }
  t.attributes = {{"shape", width > 1 ? "[B, H, Q, D]" : "[B, H, Q]"},
                  {"rows", "row i of sequence b is position kv_len(b) - q_len + i"}};
  return t;
}

PagedLogprobs paged_logprobs(const RunContext& ctx, const PagedWorkload& w, const PagedInputs& in,
                             const AttnShard* candidate, const AttnShard* reference, int vocab) {
  const Range kv = in.heads;
  const Problem& p = ctx.problem;
  const int dim = p.dims.head_dim, hq = p.dims.num_q_heads, world = ctx.collectives.size();
  const std::int64_t q_len = w.q_len;
  const std::size_t plane = static_cast<std::size_t>(q_len) * vocab;  // one (b, h)'s logits
  // This process's heads: the partial logits z[which][b][h][row][v] of each.
  const Range heads{kv.begin * p.dims.group_size(), kv.end * p.dims.group_size()};
  const auto slot = [&](int which, int b, std::int64_t h) {
    return static_cast<std::size_t>((which * p.batch + b) * heads.size() + (h - heads.begin));
  };
  std::vector<float> z(2 * static_cast<std::size_t>(p.batch * heads.size()) * plane);
  if (!heads.empty()) {
    std::vector<ProjectionJob> jobs;
    for (int which = 0; which < 2; ++which) {
      const AttnShard& rows = which == 0 ? *candidate : *reference;
      for (int b = 0; b < p.batch; ++b) {
        for (std::int64_t h = heads.begin; h < heads.end; ++h) {
          jobs.push_back(ProjectionJob{rows.out.at(b, h, 0), q_len,
                                       ctx.inputs.lm_head(vocab, h).data(), dim,
                                       z.data() + slot(which, b, h) * plane});
        }
      }
    }
    ctx.inputs.backend().project_heads(jobs, dim, vocab);
  }
  // Every head's partials to rank 0, in (which, b, h) order.
  const std::vector<int> owner = head_owners(p, in.tp, world);
  std::vector<StreamSegment> segments;
  for (int which = 0; which < 2; ++which) {
    for (int b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < hq; ++h) {
        const float* data = heads.contains(h) ? z.data() + slot(which, b, h) * plane : nullptr;
        segments.push_back(StreamSegment{owner[static_cast<std::size_t>(h)], data, plane});
      }
    }
  }
  const bool root = ctx.collectives.root();
  std::vector<float> all(root ? segments.size() * plane : 0);
  ctx.collectives.stream_to_root(segments, [&](std::size_t i, const float* data) {
    std::copy_n(data, plane, all.begin() + static_cast<std::ptrdiff_t>(i * plane));
  });
  PagedLogprobs lp;
  if (!root) return lp;
  // Per token, the heads' partials folded in ascending head order; both sides' logits kept
  // for the token's exact KL.
  std::vector<float> logits(2 * static_cast<std::size_t>(vocab));
  std::vector<const float*> terms(static_cast<std::size_t>(hq));
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t i = 0; i < q_len; ++i) {
      const std::int64_t pos = w.queries(b).begin + i;
      for (int which = 0; which < 2; ++which) {
        for (int h = 0; h < hq; ++h) {
          terms[static_cast<std::size_t>(h)] =
              all.data() + (static_cast<std::size_t>((which * p.batch + b) * hq + h)) * plane +
              i * vocab;
        }
        float* z_side = logits.data() + static_cast<std::size_t>(which) * vocab;
        fold_head_logits(terms.data(), hq, vocab, z_side);
        (which == 0 ? lp.candidate : lp.reference)
            .push_back(
                log_softmax_at_lanes(z_side, vocab, logprob_target(b, pos, p.seq_len, vocab)));
      }
      lp.kl.push_back(static_cast<float>(
          kl_divergence(logits.data() + vocab, logits.data(), vocab)));  // KL(reference ‖ cand)
    }
  }
  return lp;
}

}  // namespace cpd::paged
