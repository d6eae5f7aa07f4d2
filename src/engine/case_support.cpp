#include "case_support.h"

#include "cpdrift/engine/dlogp.h"
#include "cpdrift/numerics/bf16.h"

namespace cpd::casework {

DiffStats stats_of(const RunContext& ctx, const Tagged& t, std::optional<int> only_cp_rank) {
  std::vector<DiffPart> selected;
  for (const TaggedPart& p : t.parts) {
    if (!only_cp_rank || p.cp_rank == *only_cp_rank) selected.push_back(p.part);
  }
  return compute_diff_stats(selected, ctx.collectives, &ctx.pool);
}

std::string publish_tensor(const RunContext& ctx, const CaseGrid& grid,
                           const std::string& dump_path, const std::vector<const Shard*>& hosted,
                           int width, HeadKind heads, bool bf16) {
  const GlobalTensor t = global_tensor(grid, ctx.transport.world_size(),
                                       ctx.transport.process_index(), width, hosted, heads);
  const bool dumping = ctx.dump != nullptr && !dump_path.empty();
  PieceSink sink;
  if (dumping) {
    std::vector<std::int64_t> dims{t.batch, t.heads, t.seq_len};
    if (width > 1) dims.push_back(width);
    const bool per_token = heads == HeadKind::token;
    ctx.dump->begin(dump_path, dims,
                    {{"shape", std::string(per_token   ? "[B, 1, S]"
                                           : width > 1 ? "[B, H, S, D]"
                                                       : "[B, H, S]")},
                     {"heads", std::string(per_token               ? "none (one value per token)"
                                           : heads == HeadKind::kv ? "kv"
                                                                   : "query")},
                     {"original_dtype", std::string(bf16 ? "bfloat16" : "float32")},
                     {"stored_dtype", std::string("float32")}});
    sink = [&](const GlobalPiece& piece, const float* rows) { ctx.dump->write(piece, rows); };
  }
  const std::string digest =
      stream_digest(ctx.collectives, t, bf16 ? DigestFormat::bf16 : DigestFormat::fp32, sink);
  if (dumping) ctx.dump->end();
  return digest;
}

BackwardDrift measure_backward(const RunContext& ctx, const CaseGrid& grid,
                               const std::vector<RankOutput>& fp32, const std::string& case_name) {
  const int dim = grid.problem.dims.head_dim;
  const std::vector<RankGradients> grads = run_backward(grid, fp32, ctx.transport, ctx.inputs);
  struct Held {
    LocalCp1Backward::Result reference;
    Shard dq16, dk16, dv16;
  };
  std::vector<Held> held;
  held.reserve(grads.size());
  Tagged dq, dk, dv, dq16, dk16, dv16;
  std::vector<const Shard*> c_dq, c_dk, c_dv, r_dq, r_dk, r_dv;
  for (const RankGradients& g : grads) {
    const LogicalRank& r = g.rank;
    held.push_back(Held{
        ctx.cp1_backward->get(ctx.inputs, ctx.cp1_results, query_shape(grid, r, dim), g.dk.shape),
        bf16_written(g.dq), bf16_written(g.dk), bf16_written(g.dv)});
    const Held& h = held.back();
    dq.add(r.cp_rank, g.dq, h.reference.dq);
    dk.add(r.cp_rank, g.dk, h.reference.dk);
    dv.add(r.cp_rank, g.dv, h.reference.dv);
    dq16.add(r.cp_rank, h.dq16, h.reference.dq);
    dk16.add(r.cp_rank, h.dk16, h.reference.dk);
    dv16.add(r.cp_rank, h.dv16, h.reference.dv);
    c_dq.push_back(&g.dq);
    c_dk.push_back(&g.dk);
    c_dv.push_back(&g.dv);
    r_dq.push_back(&h.reference.dq);
    r_dk.push_back(&h.reference.dk);
    r_dv.push_back(&h.reference.dv);
  }
  BackwardDrift b;
  b.available = true;
  b.dq = stats_of(ctx, dq);
  b.dk = stats_of(ctx, dk);
  b.dv = stats_of(ctx, dv);
  b.bf16_dq = stats_of(ctx, dq16);
  b.bf16_dk = stats_of(ctx, dk16);
  b.bf16_dv = stats_of(ctx, dv16);
  for (int r = 0; r < grid.spec.cp; ++r) {
    b.per_rank.push_back(BackwardDrift::PerRank{r, stats_of(ctx, dq, r), stats_of(ctx, dk, r),
                                                stats_of(ctx, dv, r)});
  }
  const std::string base = "/cases/" + case_name + "/";
  const std::string dq_digest =
      publish_tensor(ctx, grid, base + "candidate_fp32/dq", c_dq, dim, HeadKind::query, false);
  const std::string dk_digest =
      publish_tensor(ctx, grid, base + "candidate_fp32/dk", c_dk, dim, HeadKind::kv, false);
  const std::string dv_digest =
      publish_tensor(ctx, grid, base + "candidate_fp32/dv", c_dv, dim, HeadKind::kv, false);
  if (ctx.dump_requested) {
    publish_tensor(ctx, grid, base + "reference_fp32/dq", r_dq, dim, HeadKind::query, false);
    publish_tensor(ctx, grid, base + "reference_fp32/dk", r_dk, dim, HeadKind::kv, false);
    publish_tensor(ctx, grid, base + "reference_fp32/dv", r_dv, dim, HeadKind::kv, false);
  }
  if (ctx.collectives.root()) {
    b.dq.digest = dq_digest;
    b.dk.digest = dk_digest;
    b.dv.digest = dv_digest;
  }
  return b;
}

DlogpDrift measure_dlogp(const RunContext& ctx, const CaseGrid& grid,
                         const std::vector<const AttnShard*>& candidate,
                         const std::vector<const AttnShard*>& reference,
                         const std::string& case_name) {
  const std::vector<TokenLogprobs> lp =
      run_dlogp(grid, candidate, reference, ctx.vocab_size, ctx.transport, ctx.inputs.backend());
  // The active tokens: all but each sequence's first.
  std::vector<std::vector<float>> cand(lp.size()), ref(lp.size());
  std::vector<DiffPart> parts;
  std::vector<const Shard*> c_logp, r_logp;
  for (std::size_t i = 0; i < lp.size(); ++i) {
    const ShardShape& s = lp[i].candidate.shape;
    for (int b = 0; b < s.batch; ++b) {
      for (const Range& t : s.tokens) {
        for (std::int64_t pos = std::max<std::int64_t>(t.begin, 1); pos < t.end; ++pos) {
          cand[i].push_back(lp[i].candidate.at(b, 0, s.local_row(pos))[0]);
          ref[i].push_back(lp[i].reference.at(b, 0, s.local_row(pos))[0]);
        }
      }
    }
    parts.push_back(DiffPart{cand[i].data(), ref[i].data(), cand[i].size()});
    c_logp.push_back(&lp[i].candidate);
    r_logp.push_back(&lp[i].reference);
  }
  DlogpDrift d;
  d.available = true;
  d.vocab_size = ctx.vocab_size;
  d.drift = compute_diff_stats(parts, ctx.collectives, &ctx.pool);
  // The logprob tensors [B, 1, S] (all tokens) live on the token owners: TP rank 0 of each CP
  // rank.
  const std::string base = "/cases/" + case_name + "/";
  const std::string digest =
      publish_tensor(ctx, grid, base + "candidate/logp", c_logp, 1, HeadKind::token, false);
  if (ctx.dump_requested)
    publish_tensor(ctx, grid, base + "reference/logp", r_logp, 1, HeadKind::token, false);
  if (ctx.collectives.root()) d.drift.digest = digest;
  return d;
}

}  // namespace cpd::casework
