// The training and logprob legs of a case (--include-backward, --include-dlogp): the phases that
// compute, compare and publish them.
#include <algorithm>
#include <array>
#include <map>
#include <utility>

#include "engine/case_run.h"
#include "engine/case_runner.h"
#include "engine/dlogp.h"
#include "engine/layer_logprobs.h"
#include "engine/tensor_layout.h"

namespace cpd {
namespace {

// dq, dk and dv of a set of gradients, in that order.
template <class Gradients>
auto each_gradient(Gradients& g) {
  return std::array{&g.dq, &g.dk, &g.dv};
}

// The gradients of the backward (and its te_p2p lane) vs the CP=1 reference backward's, and their
// BF16 final write: one part of the case. `keep_in_run`: the part reads the gradients where they
// are (the run's, kept for the layer's backward) instead of taking them.
void backward_part(CaseRun& run, std::vector<RankGradients>& grads, bool keep_in_run) {
  const RunContext& ctx = run.ctx;
  const CaseGrid& grid = run.grid;
  CasePart o(grid.spec.cp);
  BackwardComparisons& c = o.backward.emplace();
  if (ctx.te_p2p_backward) c.te_p2p.emplace();
  const auto fp32 = each_gradient(c);
  const std::array bf16{&c.bf16_dq, &c.bf16_dk, &c.bf16_dv};
  // Per gradient (dq, dk, dv), the hosted ranks' shards: candidate, reference, te_p2p lane.
  std::array<std::vector<const Shard*>, 3> candidate, reference, lane;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    RankGradients& g = grads[i];
    const int r = g.rank.cp_rank;
    for (const MessageHeader& h : g.dq_partials)
      run.folded.push_back(Received{g.rank.tp_rank, g.rank.cp_rank, h});
    const auto refs = each_gradient(run.reference_gradients[i]);
    const auto cands = each_gradient(g);
    for (std::size_t j = 0; j < 3; ++j) {
      const Shard& rs = keep_in_run ? *refs[j] : o.held.keep(std::move(*refs[j]));
      const Shard& cs = keep_in_run ? *cands[j] : o.held.keep(std::move(*cands[j]));
      fp32[j]->add(r, cs, rs);
      bf16[j]->add(r, cs, rs, true);
      candidate[j].push_back(&cs);
      reference[j].push_back(&rs);
      if (!g.te_p2p) continue;
      const Shard& ls = o.held.keep(std::move(*each_gradient(*g.te_p2p)[j]));
      each_gradient(*c.te_p2p)[j]->add(r, ls, rs);
      // The canonical gradients read rounded to BF16 against the lane (the statistics are
      // symmetric; the lane's digest is the vs_fp32_reference figure's).
      const std::array canonical{&c.te_p2p->canonical_dq, &c.te_p2p->canonical_dk,
                                 &c.te_p2p->canonical_dv};
      canonical[j]->add(r, cs, ls, true);
      lane[j].push_back(&ls);
    }
  }
  const std::string base = case_group(run.record.name) + "/";
  constexpr std::array<const char*, 3> kNames{"dq", "dk", "dv"};
  constexpr std::array kHeads{HeadKind::query, HeadKind::kv, HeadKind::kv};
  // The tensors in the dump's order: every candidate gradient, every reference, every lane's.
  const auto publish = [&](const char* dir, const auto& shards, Comparison* const* compared,
                           bool bf16_written) {
    for (std::size_t j = 0; j < 3; ++j) {
      if (compared != nullptr) compared[j]->candidate_tensor = static_cast<int>(o.tensors.size());
      o.tensors.push_back(case_tensor(grid, ctx.transport, base + dir + kNames[j], shards[j],
                                      grid.problem.dims.head_dim, kHeads[j], bf16_written,
                                      compared != nullptr));
    }
  };
  publish("candidate_fp32/", candidate, fp32.data(), false);
  publish("reference_fp32/", reference, nullptr, false);
  if (c.te_p2p) publish("te_p2p_backward/", lane, each_gradient(*c.te_p2p).data(), true);
  run.sink.prefill_part(o);
}

// Every active token's (candidate, reference) logprobs and their KL on rank 0, in (sequence,
// position) order: each token owner's three shards streamed there (one float a token each).
// `owned[id]`: the hosted token owners' shards.
std::vector<TokenPair> gather_tokens(const RunContext& ctx, const CaseGrid& grid,
                                     const std::map<int, std::array<const Shard*, 3>>& owned) {
  const Problem& p = grid.problem;
  const int world = ctx.collectives.size();
  std::vector<StreamSegment> segments;
  std::vector<const LogicalRank*> owners;
  for (int c = 0; c < grid.spec.cp; ++c) {
    const LogicalRank& o = grid.at(0, c);
    owners.push_back(&o);
    const auto here = owned.find(o.id);
    const std::size_t floats = static_cast<std::size_t>(p.batch * total_size(o.tokens));
    for (int which = 0; which < 3; ++which) {
      const float* data = nullptr;
      if (here != owned.end()) data = here->second[static_cast<std::size_t>(which)]->data.data();
      segments.push_back(StreamSegment{process_of(o.id, world), data, floats});
    }
  }
  std::vector<std::vector<float>> pieces(segments.size());
  ctx.collectives.stream_to_root(segments, [&](std::size_t i, const float* data) {
    pieces[i].assign(data, data + segments[i].floats);
  });
  std::vector<TokenPair> tokens;
  if (!ctx.collectives.root()) return tokens;
  // Each position's owner (CP rank) and its row in that owner's shards.
  std::vector<int> owner_of(static_cast<std::size_t>(p.seq_len), 0);
  std::vector<std::int64_t> row_of(owner_of.size(), 0);
  for (int c = 0; c < grid.spec.cp; ++c) {
    std::int64_t row = 0;
    for (const Range& t : owners[static_cast<std::size_t>(c)]->tokens) {
      for (std::int64_t pos = t.begin; pos < t.end; ++pos, ++row) {
        owner_of[static_cast<std::size_t>(pos)] = c;
        row_of[static_cast<std::size_t>(pos)] = row;
      }
    }
  }
  // Interior boundaries between CP shards (where the owner changes) and between KV blocks,
  // each as the first position after it.
  std::vector<std::int64_t> shard_edges, split_edges;
  for (std::int64_t pos = 1; pos < p.seq_len; ++pos) {
    if (owner_of[static_cast<std::size_t>(pos)] != owner_of[static_cast<std::size_t>(pos - 1)])
      shard_edges.push_back(pos);
  }
  for (const Range& b : kv_block_bounds(grid.spec, p.seq_len)) {
    if (b.begin > 0) split_edges.push_back(b.begin);
  }
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t pos = 1; pos < p.seq_len; ++pos) {  // the active tokens
      const int c = owner_of[static_cast<std::size_t>(pos)];
      const std::int64_t rows = total_size(owners[static_cast<std::size_t>(c)]->tokens);
      const std::size_t at =
          static_cast<std::size_t>(b * rows + row_of[static_cast<std::size_t>(pos)]);
      tokens.push_back(TokenPair{b, pos, c, pieces[static_cast<std::size_t>(3 * c)][at],
                                 pieces[static_cast<std::size_t>(3 * c + 1)][at],
                                 pieces[static_cast<std::size_t>(3 * c + 2)][at],
                                 boundary_distance(shard_edges, pos),
                                 boundary_distance(split_edges, pos)});
    }
  }
  return tokens;
}

// Target-token logprobs of the candidate vs the reference (`logprobs`, per hosted token owner),
// over the active tokens: one part of case `name`.
void add_dlogp(const RunContext& ctx, const CaseGrid& grid, const std::string& name,
               std::vector<TokenLogprobs> logprobs, CaseSink& sink) {
  CasePart o(grid.spec.cp);
  Comparison& c = o.dlogp.emplace();
  std::vector<const Shard*> cand_logp, ref_logp;
  std::map<int, std::array<const Shard*, 3>> owned;  // token owner id -> its shards
  for (TokenLogprobs& lp : logprobs) {
    // The active tokens: all but each sequence's first.
    std::vector<float> cand, ref;
    const ShardShape& s = lp.candidate.shape;
    for (int b = 0; b < s.batch; ++b) {
      for (const Range& t : s.tokens) {
        for (std::int64_t pos = std::max<std::int64_t>(t.begin, 1); pos < t.end; ++pos) {
          cand.push_back(lp.candidate.at(b, 0, s.local_row(pos))[0]);
          ref.push_back(lp.reference.at(b, 0, s.local_row(pos))[0]);
        }
      }
    }
    const std::vector<float>& kept = o.held.keep(std::move(cand));
    c.add(lp.rank.cp_rank, kept.data(), o.held.keep(std::move(ref)).data(), kept.size());
    cand_logp.push_back(&o.held.keep(std::move(lp.candidate)));
    ref_logp.push_back(&o.held.keep(std::move(lp.reference)));
    owned[lp.rank.id] = {cand_logp.back(), ref_logp.back(), &o.held.keep(std::move(lp.kl))};
  }
  o.dlogp_tokens = gather_tokens(ctx, grid, owned);
  // The logprob tensors [B, 1, S] (all tokens) live on the token owners: TP rank 0 of each CP
  // rank.
  const std::string base = case_group(name) + "/";
  c.candidate_tensor = static_cast<int>(o.tensors.size());
  o.tensors.push_back(case_tensor(grid, ctx.transport, base + "candidate/logp", cand_logp, 1,
                                  HeadKind::token, false, true));
  o.tensors.push_back(case_tensor(grid, ctx.transport, base + "reference/logp", ref_logp, 1,
                                  HeadKind::token, false, false));
  sink.prefill_part(o);
}

}  // namespace

namespace phase_run {

void dlogp(CaseRun& r) {
  if (r.grid.problem.layer) {  // through the layer's output, as o_proj wrote it
    add_dlogp(r.ctx, r.grid, r.record.name,
              run_layer_dlogp(r.grid, r.layer, r.ctx.vocab_size, r.ctx.transport, r.ctx.inputs),
              r.sink);
    r.layer.clear();
    return;
  }
  // Candidate: the case's CP output as written (BF16 under --dtype bf16); reference: the FP32
  // CP=1 output cast the same way.
  std::vector<AttnShard> cast;
  for (const AttnShard* a : r.reference)
    cast.push_back(final_write(*a, r.ctx.problem.dtype == DType::bf16, r.ctx.pool));
  HostedAttention cast_of;
  for (const AttnShard& c : cast) cast_of.push_back(&c);
  add_dlogp(
      r.ctx, r.grid, r.record.name,
      run_dlogp(r.grid, r.dtype_written, cast_of, r.ctx.vocab_size, r.ctx.transport, r.ctx.inputs),
      r.sink);
  r.dtype_runs.clear();  // the dtype path's output has served its last phase
  r.dtype_written.clear();
}

void reference_backward(CaseRun& r) {
  // The dtype path's output served dlogp; the backward starts from the FP32 path's.
  r.dtype_runs.clear();
  r.dtype_written.clear();
  const TransportCounters before = r.ctx.transport.counters();
  r.reference_gradients = shared_cp1_backward(r.grid, r.ctx.transport, r.ctx.collectives,
                                              r.ctx.inputs, *r.ctx.cp1_backward, r.reference);
  // Before the case's own backward runs; the layer's backward reads the reference's attention.
  if (!r.grid.problem.layer) r.release_references();
  r.reference_traffic = r.ctx.transport.counters() - before;
}

void backward(CaseRun& r) {
  std::vector<RankGradients> grads =
      run_backward(r.grid, r.fp32, r.ctx.transport, r.ctx.inputs, r.ctx.te_p2p_backward);
  if (r.grid.problem.layer) {  // published from the run, where the layer's backward reads them
    r.gradients = std::move(grads);
    backward_part(r, r.gradients, true);
    return;
  }
  backward_part(r, grads, false);
  r.reference_gradients.clear();
}

}  // namespace phase_run
}  // namespace cpd
