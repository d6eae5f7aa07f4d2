#include "paged_publish.h"

#include <algorithm>

#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/cpu/input_store.h"
#include "cpdrift/engine/tensor_stream.h"
#include "cpdrift/io/tensor_dump.h"
#include "cpdrift/numerics/logprob_math.h"
#include "paged_lanes.h"

namespace cpd::paged {
namespace {

// The [B, Hq, q_len, width] tensor of one lane: pieces in global order, each held by the
// process computing its KV head.
GlobalTensor query_rows(const RunContext& ctx, const PagedWorkload& w, const Shard* local,
                        int width) {
  const Problem& p = ctx.problem;
  const int world = ctx.collectives.size(), me = ctx.collectives.rank(),
            group = p.dims.group_size();
  std::vector<int> owner(static_cast<std::size_t>(p.dims.num_kv_heads), 0);
  for (int r = 0; r < world; ++r) {
    const Range heads = kv_heads_of(p, world, r);
    for (std::int64_t g = heads.begin; g < heads.end; ++g) owner[static_cast<std::size_t>(g)] = r;
  }
  GlobalTensor t;
  t.batch = p.batch;
  t.heads = p.dims.num_q_heads;
  t.seq_len = w.q_len;
  t.width = width;
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.dims.num_q_heads; ++h) {
      const int proc = owner[static_cast<std::size_t>(h / group)];
      t.pieces.push_back(GlobalPiece{b, h, Range{0, w.q_len}, proc});
      t.segments.push_back(StreamSegment{proc, proc == me ? local->at(b, h, 0) : nullptr,
                                         static_cast<std::size_t>(w.q_len * width)});
    }
  }
  return t;
}

// Streams one tensor to rank 0 (digest; dump and `collect` there when given).
std::string stream(const RunContext& ctx, const GlobalTensor& t, bool bf16,
                   const std::string& dump_path, std::vector<float>* collect) {
  const bool dumping = ctx.dump != nullptr;
  if (dumping) {
    std::vector<std::int64_t> dims{t.batch, t.heads, t.seq_len};
    if (t.width > 1) dims.push_back(t.width);
    ctx.dump->begin(dump_path, dims,
                    {{"shape", std::string(t.width > 1 ? "[B, H, Q, D]" : "[B, H, Q]")},
                     {"rows", std::string("row i of sequence b is position kv_len(b) - q_len + i")},
                     {"original_dtype", std::string(bf16 ? "bfloat16" : "float32")},
                     {"stored_dtype", std::string("float32")}});
  }
  if (collect != nullptr && ctx.collectives.root()) {
    collect->assign(static_cast<std::size_t>(t.batch * t.heads * t.seq_len * t.width), 0.0f);
  }
  const PieceSink sink = [&](const GlobalPiece& piece, const float* rows) {
    if (dumping) ctx.dump->write(piece, rows);
    if (collect != nullptr) {
      const std::size_t n = static_cast<std::size_t>(piece.tokens.size() * t.width);
      std::copy_n(
          rows, n,
          collect->begin() + static_cast<std::ptrdiff_t>((piece.b * t.heads + piece.h) * n));
    }
  };
  const std::string digest =
      stream_digest(ctx.collectives, t, bf16 ? DigestFormat::bf16 : DigestFormat::fp32, sink);
  if (dumping) ctx.dump->end();
  return digest;
}

}  // namespace

Published publish_rows(const RunContext& ctx, const PagedWorkload& w, const std::string& case_name,
                       const AttnShard& candidate, const AttnShard& reference, Range kv_heads,
                       bool bf16) {
  const int dim = ctx.problem.dims.head_dim;
  const bool local = !kv_heads.empty();
  const std::string base = "/paged_cases/" + case_name + "/";
  if (ctx.dump != nullptr) {
    std::string lens;
    for (const std::int64_t len : w.kv_lens)
      lens += (lens.empty() ? "" : ",") + std::to_string(len);
    ctx.dump->annotate("/paged_cases/" + case_name, {{"kv_lens", lens},
                                                     {"q_len", w.q_len},
                                                     {"page_size", std::int64_t{w.page_size}},
                                                     {"shared_prefix_tokens", w.prefix_len}});
  }
  Published pub;
  pub.candidate_out = stream(ctx, query_rows(ctx, w, local ? &candidate.out : nullptr, dim), bf16,
                             base + "candidate/out", &pub.candidate_hidden);
  pub.candidate_lse = stream(ctx, query_rows(ctx, w, local ? &candidate.lse : nullptr, 1), false,
                             base + "candidate/lse", nullptr);
  stream(ctx, query_rows(ctx, w, local ? &reference.out : nullptr, dim), bf16,
         base + "reference/out", &pub.reference_hidden);
  if (ctx.dump_requested) {  // collective: every process knows, only rank 0 holds the writer
    stream(ctx, query_rows(ctx, w, local ? &reference.lse : nullptr, 1), false,
           base + "reference/lse", nullptr);
  }
  return pub;
}

DiffStats dlogp_drift(const RunContext& ctx, const PagedWorkload& w, const Published& rows,
                      int vocab) {
  const Problem& p = ctx.problem;
  std::vector<float> logp[2];
  if (ctx.collectives.root()) {
    const int dim = p.dims.head_dim, hq = p.dims.num_q_heads;
    const std::int64_t q_len = w.q_len;
    const std::vector<float> lm_head = lm_head_columns(p, vocab, Range{0, std::int64_t{hq} * dim});
    for (int which = 0; which < 2; ++which) {
      const std::vector<float>& hidden = which == 0 ? rows.candidate_hidden : rows.reference_hidden;
      std::vector<float> z(static_cast<std::size_t>(p.batch) * hq * q_len * vocab);
      std::vector<ProjectionJob> jobs;
      for (int b = 0; b < p.batch; ++b) {
        for (int h = 0; h < hq; ++h) {
          const std::size_t at = static_cast<std::size_t>(b * hq + h) * q_len;
          jobs.push_back(ProjectionJob{hidden.data() + at * dim, q_len,
                                       lm_head.data() + std::int64_t{h} * dim,
                                       std::int64_t{hq} * dim, z.data() + at * vocab});
        }
      }
      ctx.inputs.backend().project_heads(jobs, dim, vocab);
      std::vector<float> logits(static_cast<std::size_t>(vocab));
      std::vector<const float*> heads(static_cast<std::size_t>(hq));
      for (int b = 0; b < p.batch; ++b) {
        for (std::int64_t i = 0; i < q_len; ++i) {
          for (int h = 0; h < hq; ++h) {
            heads[static_cast<std::size_t>(h)] =
                z.data() + (static_cast<std::size_t>(b * hq + h) * q_len + i) * vocab;
          }
          fold_head_logits(heads.data(), hq, vocab, logits.data());
          const std::int64_t pos = w.queries(b).begin + i;
          logp[which].push_back(
              log_softmax_at(logits.data(), vocab, logprob_target(b, pos, p.seq_len, vocab)));
        }
      }
    }
  }
  const DiffPart part{logp[0].data(), logp[1].data(), logp[0].size()};
  return compute_diff_stats(std::span<const DiffPart>(&part, 1), ctx.collectives, &ctx.pool);
}

}  // namespace cpd::paged
