#include "engine/work_plan.h"

#include <algorithm>

#include "core/plan.h"
#include "engine/layer_backward.h"

namespace cpd {
namespace {

constexpr std::uint64_t kHeaderBytes = sizeof(MessageHeader);

std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(v); }

// The forward's partial states of every query range against every block: computed by the
// block's owner (ag_rs, and sent to the query owner) or by the query owner (ring_kv,
// allgather_kv, which check them locally and send none). Round i sends the i-th row group of a
// range against each block some row of the group can see.
void forward_states(const CaseGrid& grid, PhaseWork& w) {
  const std::int64_t dim = grid.problem.dims.head_dim, batch = grid.problem.batch;
  const bool at_block_owner = grid.spec.protocol == Protocol::ag_rs;
  for (const LogicalRank& dst : grid.ranks) {
    const std::int64_t heads = dst.q_heads.size();
    for (const Range& t : dst.tokens) {
      const std::int64_t groups = (t.size() + grid.round_rows - 1) / grid.round_rows;
      for (const KvBlock& b : grid.blocks) {
        const int owner = grid.at(dst.tp_rank, b.owner_cp_rank).id;
        w.pairs[u64(at_block_owner ? owner : dst.id)] +=
            u64(batch * heads) * causal_pairs(t, b.range);
        if (!at_block_owner) continue;
        // Groups wholly before the block see none of it.
        const std::int64_t blind =
            b.range.begin >= t.end
                ? groups
                : std::max<std::int64_t>(0, b.range.begin - t.begin) / grid.round_rows;
        if (blind == groups) continue;
        const std::int64_t rows = t.end - (t.begin + blind * grid.round_rows);
        w.add(owner, dst.id, u64(groups - blind), u64(batch * heads * rows * (dim + 1)));
      }
    }
  }
}

void add_all(PhaseWork& w, const std::vector<MessageHeader>& headers) {
  for (const MessageHeader& h : headers) w.add(h.src, h.dst, 1, u64(h.floats));
}

// What moves before the states: query rows (ag_rs) or K/V shards (the others).
void forward_shards(const CaseGrid& grid, PhaseWork& w) {
  for (const LogicalRank& dst : grid.ranks) {
    switch (grid.spec.protocol) {
      case Protocol::ag_rs:
        add_all(w, expected_q_shards(grid, dst));
        break;
      case Protocol::allgather_kv:
        add_all(w, expected_kv_allgather(grid, dst));
        break;
      case Protocol::ring_kv:
        for (int step = 1; step < grid.spec.cp; ++step)
          add_all(w, expected_kv_ring(grid, dst, step));
        break;
    }
  }
}

void add_backward(const CaseGrid& grid, PhaseWork& w) {
  const std::int64_t dim = grid.problem.dims.head_dim, batch = grid.problem.batch;
  const int cp = grid.spec.cp;
  const Range all{0, grid.problem.seq_len};
  const BlockCounts counts(grid);
  for (const KvBlock& b : grid.blocks) {
    for (int t = 0; t < grid.spec.tp; ++t) {
      const LogicalRank& owner = grid.at(t, b.owner_cp_rank);
      w.pairs[u64(owner.id)] += u64(batch * owner.q_heads.size()) * causal_pairs(all, b.range);
    }
  }
  for (const Range& span : grid.backward_rounds()) {
    for (const LogicalRank& q : grid.ranks) {
      const std::int64_t heads = q.q_heads.size();
      for (const Range& t : q.tokens) {
        const Range part = intersection(t, span);
        if (part.empty()) continue;
        // Rows to every other CP rank with a block that sees them.
        for (int r = 0; r < cp; ++r) {
          if (r != q.cp_rank && counts.seen_by(r, part.end) > 0)
            w.add(q.id, grid.at(q.tp_rank, r).id, 1,
                  u64(batch * heads * part.size() * (2 * dim + 2)));
        }
        // A partial dq from each block that sees the part, sent by its owner.
        for (int r = 0; r < cp; ++r) {
          const std::int64_t n = counts.seen_by(r, part.end);
          if (n > 0) {
            w.add(grid.at(q.tp_rank, r).id, q.id, u64(n),
                  u64(n * batch * heads * part.size() * dim));
          }
        }
      }
    }
  }
}

}  // namespace

BlockCounts::BlockCounts(const CaseGrid& g) : grid(g) {
  owned_before.assign(static_cast<std::size_t>(g.spec.cp),
                      std::vector<std::int64_t>(g.blocks.size() + 1, 0));
  for (std::size_t i = 0; i < g.blocks.size(); ++i) {
    for (int r = 0; r < g.spec.cp; ++r) {
      owned_before[static_cast<std::size_t>(r)][i + 1] =
          owned_before[static_cast<std::size_t>(r)][i] + (g.blocks[i].owner_cp_rank == r ? 1 : 0);
    }
  }
}

std::int64_t BlockCounts::seen_by(int cp, std::int64_t end) const {
  const std::size_t seen = static_cast<std::size_t>(
      std::lower_bound(grid.blocks.begin(), grid.blocks.end(), end,
                       [](const KvBlock& b, std::int64_t e) { return b.range.begin < e; }) -
      grid.blocks.begin());
  return owned_before[static_cast<std::size_t>(cp)][seen];
}

PhaseWork::PhaseWork(int ranks)
    : pairs(static_cast<std::size_t>(ranks), 0),
      sent(static_cast<std::size_t>(ranks)),
      received(static_cast<std::size_t>(ranks)),
      bytes_between(static_cast<std::size_t>(ranks) * static_cast<std::size_t>(ranks), 0) {}

void PhaseWork::add(int src, int dst, std::uint64_t messages, std::uint64_t payload_floats) {
  const Traffic t{messages, messages * kHeaderBytes + payload_floats * sizeof(float)};
  sent[u64(src)] += t;
  received[u64(dst)] += t;
  bytes_between[u64(src) * pairs.size() + u64(dst)] += t.bytes;
}

std::uint64_t PhaseWork::total_pairs() const {
  std::uint64_t n = 0;
  for (const std::uint64_t p : pairs) n += p;
  return n;
}

Traffic PhaseWork::total_sent() const {
  Traffic t;
  for (const Traffic& s : sent) t += s;
  return t;
}

std::vector<ForwardPath> forward_paths(DType dtype, bool gpu, bool cpu_check) {
  using K = ForwardPathKind;
  std::vector<ForwardPath> paths{{K::fp32, "fp32"}};
  if (dtype == DType::bf16) paths.push_back({K::bf16_inputs, "bf16_inputs"});
  paths.push_back({K::bf16_kernel, "bf16_kernel", true});
  if (gpu) paths.push_back({K::cublas_unfused, "cublas_unfused", true});
  if (cpu_check) paths.push_back({K::cpu_fp32, "cpu_fp32", false, true});
  return paths;
}

std::uint64_t causal_pairs(const Range& rows, const Range& keys) {
  if (rows.empty() || keys.empty()) return 0;
  const std::int64_t c = keys.begin, d = keys.end;
  std::uint64_t n = 0;
  // Rows inside the keys see keys.begin … themselves: 1, 2, … pairs.
  const std::int64_t lo = std::max(rows.begin, c) - c, hi = std::min(rows.end, d) - c;
  if (lo < hi) n += u64(hi * (hi + 1) / 2 - lo * (lo + 1) / 2);
  // Rows past the keys see all of them.
  const std::int64_t past = std::max(rows.begin, d);
  if (past < rows.end) n += u64((rows.end - past) * (d - c));
  return n;
}

PhaseWork forward_work(const CaseGrid& grid) {
  PhaseWork w(grid.spec.num_logical_ranks());
  forward_shards(grid, w);
  forward_states(grid, w);
  return w;
}

PhaseWork backward_work(const CaseGrid& grid) {
  PhaseWork w(grid.spec.num_logical_ranks());
  add_backward(grid, w);
  return w;
}

PhaseWork chain_work(const CaseGrid& grid, const TpChain& chain) {
  PhaseWork w(grid.spec.num_logical_ranks());
  const int steps = chain_steps(grid, chain);
  for (const LogicalRank& dst : grid.ranks) {
    for (int step = 0; step < steps; ++step)
      add_all(w, expected_chain_partials(grid, chain, dst, step));
  }
  return w;
}

PhaseWork o_proj_work(const CaseGrid& grid) {
  PhaseWork w = chain_work(grid, layer_chain(grid));
  const Problem& p = grid.problem;
  for (const LogicalRank& r : grid.ranks) {
    std::uint64_t tokens = 0;
    for (const Range& t : r.tokens) tokens += static_cast<std::uint64_t>(t.size());
    // The candidate and the reference: per token, output and head, one D-long dot.
    w.pairs[static_cast<std::size_t>(r.id)] = 2 * static_cast<std::uint64_t>(p.batch) * tokens *
                                              static_cast<std::uint64_t>(p.dims.hidden_size) *
                                              static_cast<std::uint64_t>(r.q_heads.size());
  }
  return w;
}

PhaseWork layer_backward_work(const CaseGrid& grid) {
  PhaseWork w = chain_work(grid, layer_chain(grid));
  for (const TokenChain& chain : {layer_qkv_chain(grid), layer_o_chain(grid)}) {
    const int steps = token_chain_steps(grid, chain);
    for (const LogicalRank& dst : grid.ranks) {
      for (int step = 0; step < steps; ++step)
        add_all(w, expected_token_partials(grid, chain, dst, step));
    }
  }
  const Problem& p = grid.problem;
  const std::uint64_t hidden = static_cast<std::uint64_t>(p.dims.hidden_size);
  const std::uint64_t width = static_cast<std::uint64_t>(layer_qkv_chain(grid).inputs);
  for (const LogicalRank& r : grid.ranks) {
    std::uint64_t tokens = 0;
    for (const Range& t : r.tokens) tokens += static_cast<std::uint64_t>(t.size());
    const std::uint64_t heads =
        static_cast<std::uint64_t>(r.q_heads.size() + 2 * r.kv_heads.size());
    // Per token: dX's hidden outputs over the heads' features, q/k/v_proj's features over the
    // input (and bias) columns, o_proj's hidden outputs over the query heads' columns.
    w.pairs[static_cast<std::size_t>(r.id)] =
        2 * static_cast<std::uint64_t>(p.batch) * tokens *
        (hidden * heads + heads * width + hidden * static_cast<std::uint64_t>(r.q_heads.size()));
  }
  return w;
}

PhaseWork dlogp_work(const CaseGrid& grid, int vocab) {
  if (!grid.problem.layer) return chain_work(grid, logit_chain(grid, vocab));
  PhaseWork w(grid.spec.num_logical_ranks());
  for (const LogicalRank& dst : grid.ranks) {
    for (int step = 0; step < layer_dlogp_steps(grid, vocab); ++step)
      add_all(w, expected_layer_logits(grid, dst, vocab, step));
  }
  return w;
}

PhaseWork reference_forward_work(const CaseGrid& grid) {
  const Problem& p = grid.problem;
  const Range all{0, p.seq_len};
  const bool counterpart_differs =
      kv_block_bounds(cp1_counterpart(grid.spec), p.seq_len) != std::vector<Range>{all};
  PhaseWork w(grid.spec.num_logical_ranks());
  for (const LogicalRank& r : grid.ranks) {
    std::uint64_t own = 0;
    for (const Range& t : r.tokens) own += causal_pairs(t, all);
    w.pairs[u64(r.id)] = u64(p.batch * r.q_heads.size()) * own * (counterpart_differs ? 2 : 1);
  }
  return w;
}

PhaseWork reference_backward_work(const CaseGrid& grid) {
  const Problem& p = grid.problem;
  const Range all{0, p.seq_len};
  PhaseWork w(grid.spec.num_logical_ranks());
  for (const LogicalRank& r : grid.ranks) {
    const std::uint64_t heads = u64(reference_kv_heads(grid, r, 0, p.dims.num_kv_heads).size());
    w.pairs[u64(r.id)] = heads * u64(p.batch * p.dims.group_size()) * causal_pairs(all, all);
  }
  return w;
}

}  // namespace cpd
