// What each kind of phase holds at its high-water on each process, as the CPU backend allocates
// its buffers (the protocols, case_runner.cpp, the backward and its CP=1 reference).
#include <algorithm>

#include "cpdrift/production_lanes.h"
#include "engine/local_cp1.h"
#include "engine/memory_plan.h"
#include "engine/phase_memory_util.h"
#include "engine/protocol_common.h"
#include "kernels/cpu/attention.h"

namespace cpd {
namespace {

using namespace phase_memory_util;

std::uint64_t header_floats(const std::vector<MessageHeader>& headers) {
  std::uint64_t n = 0;
  for (const MessageHeader& h : headers) n += u64(h.floats);
  return n;
}

// One exchange's buffers at one process: the payloads it produced for its own ranks (`local`)
// and for other processes (`sent`, sent from where they are), and those that arrived (received
// into buffers of their own: the MPI transport copies nothing).
struct Exchange {
  std::uint64_t local = 0, sent = 0, received = 0;
  std::uint64_t peak() const { return local + sent + received; }
};

void add_message(std::vector<Exchange>& at, int processes, int src, int dst, std::uint64_t bytes) {
  Exchange& from = at[static_cast<std::size_t>(process_of(src, processes))];
  if (process_of(src, processes) == process_of(dst, processes)) {
    from.local += bytes;
  } else {
    from.sent += bytes;
    at[static_cast<std::size_t>(process_of(dst, processes))].received += bytes;
  }
}

// The forward's states of round `round`, per process.
std::vector<Exchange> forward_round(const CaseGrid& grid, const BlockCounts& counts, int round,
                                    int processes) {
  const Problem& p = grid.problem;
  std::vector<Exchange> at(static_cast<std::size_t>(processes));
  const bool at_block_owner = grid.spec.protocol == Protocol::ag_rs;
  for (const LogicalRank& dst : grid.ranks) {
    for (const Range& t : dst.tokens) {
      const Range g = grid.round_group(t, round);
      if (g.empty()) continue;
      const std::uint64_t state =
          tensor_bytes(p.batch, dst.q_heads.size(), g.size(), p.dims.head_dim + 1);
      for (int c = 0; c < grid.spec.cp; ++c) {
        const std::int64_t n = counts.seen_by(c, g.end);
        const int src = at_block_owner ? grid.at(dst.tp_rank, c).id : dst.id;
        add_message(at, processes, src, dst.id, u64(n) * state);
      }
    }
  }
  return at;
}

// The backward round of `span` on each process: the query rows (q, dO, lse, Δ) packed by their
// owners and sent to the KV owners that see them, and the partial dq sent back.
std::vector<std::uint64_t> backward_round(const CaseGrid& grid, const BlockCounts& counts,
                                          const Range& span, int processes) {
  const Problem& p = grid.problem;
  const int dim = p.dims.head_dim, cp = grid.spec.cp;
  std::vector<std::uint64_t> rows(static_cast<std::size_t>(processes), 0);
  std::vector<Exchange> partials(static_cast<std::size_t>(processes));
  for (const LogicalRank& q : grid.ranks) {
    const std::size_t home = static_cast<std::size_t>(process_of(q.id, processes));
    for (const Range& t : q.tokens) {
      const Range part = intersection(t, span);
      if (part.empty()) continue;
      const std::uint64_t packed =
          tensor_bytes(p.batch, q.q_heads.size(), part.size(), 2 * dim + 2);
      rows[home] += packed;  // packed by its owner
      for (int r = 0; r < cp; ++r) {
        if (r == q.cp_rank) continue;
        if (counts.seen_by(r, part.end) > 0)
          rows[static_cast<std::size_t>(process_of(grid.at(q.tp_rank, r).id, processes))] +=
              packed;  // received where a block sees them
      }
      const std::uint64_t partial = tensor_bytes(p.batch, q.q_heads.size(), part.size(), dim);
      for (int r = 0; r < cp; ++r) {
        add_message(partials, processes, grid.at(q.tp_rank, r).id, q.id,
                    u64(counts.seen_by(r, part.end)) * partial);
      }
    }
  }
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] += partials[i].peak();
  return rows;
}

Range kv_heads_of(const Problem& p, const LogicalRank& r) {
  const int group = p.dims.group_size();
  return Range{r.q_heads.begin / group, (r.q_heads.end - 1) / group + 1};
}

// The K/V or query rows a hosted rank's protocol receives before its states.
std::uint64_t exchanged_shards(const CaseGrid& grid, const LogicalRank& r) {
  switch (grid.spec.protocol) {
    case Protocol::ag_rs:
      return header_floats(expected_q_shards(grid, r)) * kFloat;
    case Protocol::allgather_kv:
      return 2 * header_floats(expected_kv_allgather(grid, r)) * kFloat;
    case Protocol::ring_kv: {
      std::uint64_t pieces = 0, widest = 0;
      for (int step = 1; step < grid.spec.cp; ++step) {
        const std::uint64_t n = header_floats(expected_kv_ring(grid, r, step)) * kFloat;
        pieces += n;
        widest = std::max(widest, n);
      }
      return pieces + widest;
    }
  }
  return 0;
}

// The production lanes' per-rank folds of kLaneRows rows (merge_production_lanes), one at a time.
std::uint64_t lane_folds(CaseMemory& m, std::size_t proc) {
  const Problem& p = m.problem();
  std::uint64_t widest = 0;
  for (const LogicalRank* r : m.hosted(proc)) {
    std::int64_t rows = 0;
    for (const Range& t : r->tokens) rows = std::max(rows, std::min(t.size(), protocol::kLaneRows));
    widest = std::max(widest, u64(m.grid().spec.cp) * u64(p.batch) * u64(r->q_heads.size()) *
                                  u64(rows) * u64(p.dims.head_dim + 1) * kFloat);
  }
  return widest;
}

}  // namespace

std::uint64_t CaseMemory::forward_round_peak(std::size_t proc) {
  if (forward_peaks_.empty()) {
    forward_peaks_.assign(processes(), 0);
    const BlockCounts counts(grid_);
    for (int round = 0; round < grid_.rounds(); ++round) {
      const std::vector<Exchange> at =
          forward_round(grid_, counts, round, static_cast<int>(processes()));
      for (std::size_t i = 0; i < at.size(); ++i)
        forward_peaks_[i] = std::max(forward_peaks_[i], at[i].peak());
    }
  }
  return forward_peaks_[proc];
}

std::uint64_t CaseMemory::backward_round_peak(std::size_t proc) {
  if (backward_peaks_.empty()) {
    backward_peaks_.assign(processes(), 0);
    const BlockCounts counts(grid_);
    for (const Range& span : grid_.backward_rounds()) {
      const std::vector<std::uint64_t> at =
          backward_round(grid_, counts, span, static_cast<int>(processes()));
      for (std::size_t i = 0; i < at.size(); ++i)
        backward_peaks_[i] = std::max(backward_peaks_[i], at[i]);
    }
  }
  return backward_peaks_[proc];
}

namespace phase_memory {

// The CP=1 FP32 reference forward of every hosted rank's rows (and, where its grid differs, the
// topology counterpart): the result, its memo copy, the returned copy.
void reference_forward(CaseMemory& m) {
  const Problem& p = m.problem();
  for (std::size_t proc = 0; proc < m.processes(); ++proc) {
    ProcessMemos& memos = m.memos(proc);
    for (const LogicalRank* r : m.hosted(proc)) {
      std::int64_t kv_end = 0;
      for (const Range& t : r->tokens) kv_end = std::max(kv_end, t.end);
      memos.touch(TensorId::q, p.batch, r->q_heads);
      memos.touch(TensorId::k, p.batch, kv_heads_of(p, *r));
      memos.touch(TensorId::v, p.batch, kv_heads_of(p, *r));
      memos.forward_keys = std::max(memos.forward_keys, u64(kv_end));
    }
    const std::uint64_t references =
        each(m, proc, [](const LogicalRank&, RankSizes s) { return s.attention(); });
    m.references(proc) = references;
    const bool memoise = !m.last_case() && memos.cp1_memo + references <= kCp1MemoBytes;
    m.add_phase(proc, kReferenceForwardPhase,
                {{"references", references}, {"reference being computed", references}});
    if (memoise) memos.cp1_memo += references;
  }
}

// One forward path's exchange: its inputs, the rows or K/V received, its outputs (the FP32 path
// with the probe's and the oracle's, the BF16 kernel's with the lanes'), one round's states.
void forward_path(CaseMemory& m, const ForwardPath& path) {
  const Problem& p = m.problem();
  const CaseGrid& grid = m.grid();
  const bool fp32 = path.kind == ForwardPathKind::fp32;
  const bool lanes = path.kind == ForwardPathKind::bf16_kernel;
  const std::uint64_t copies = fp32 ? 3 : lanes ? 1 + kProductionLanes.size() : 1;
  for (std::size_t proc = 0; proc < m.processes(); ++proc) {
    ProcessMemos& memos = m.memos(proc);
    std::uint64_t exchanged = 0;
    for (const LogicalRank* r : m.hosted(proc)) {
      memos.touch(TensorId::q, p.batch, r->q_heads);
      memos.touch(TensorId::k, p.batch, r->kv_heads);
      memos.touch(TensorId::v, p.batch, r->kv_heads);
      exchanged += exchanged_shards(grid, *r);
    }
    const auto own_query_rows = [&](const LogicalRank& r, RankSizes s) -> std::uint64_t {
      return protocol::serves_own_rows_in_place(grid.spec.protocol, r) ? 0 : s.q;
    };
    m.add_phase(
        proc, kForwardPhasePrefix + std::string(path.name),
        {{"references", m.references(proc)},
         {"outputs of earlier paths", m.kept(proc)},
         {"path inputs (q, k, v)",
          each(m, proc, [](const LogicalRank&, RankSizes s) { return s.q + 2 * s.kv; })},
         {"own query rows", each(m, proc, own_query_rows)},
         {grid.spec.protocol == Protocol::ag_rs ? "query rows received" : "K/V received",
          exchanged},
         {fp32    ? "outputs, merge-order probe, FP64 oracle"
          : lanes ? "outputs, production lanes"
                  : "outputs",
          each(m, proc, [&](const LogicalRank&, RankSizes s) { return copies * s.attention(); })},
         {"one round's states", m.forward_round_peak(proc)},
         {"production lanes' per-rank folds", lanes ? lane_folds(m, proc) : 0}});
    for (const LogicalRank* r : m.hosted(proc)) {
      for (const KvBlock& b : grid.blocks_of(r->cp_rank))
        memos.forward_keys = std::max(memos.forward_keys, u64(b.range.size()));
    }
    // Kept: the FP32 path's output (for the backward) and the dtype path's (for dlogp).
    if (fp32 || path.kind == ForwardPathKind::bf16_inputs) m.kept(proc) += m.references(proc);
  }
}

// The layer's dlogp, a chunk a step (layer_logit_chain): on the owner the chunk's rows it sends,
// its range's logits and the whole rows it gathers them into; on each other TP rank the rows it
// received and its range's logits; on the owners the layer's outputs, kept since o_proj. The
// vocabulary rows of the lm_head each rank projects onto stay in the input store (the memos).
static void layer_dlogp(CaseMemory& m, int vocab) {
  const Problem& p = m.problem();
  const TpChain chain = layer_logit_chain(m.grid(), vocab);
  const std::uint64_t hidden = u64(p.dims.hidden_size), batch = u64(p.batch);
  for (std::size_t proc = 0; proc < m.processes(); ++proc) {
    std::uint64_t step = 0, outputs = 0;
    for (const LogicalRank* r : m.hosted(proc)) {
      std::uint64_t rows = 0, tokens = 0;
      for (const Range& c : chain_chunks(chain, *r)) rows = std::max(rows, u64(c.size()));
      for (const Range& t : r->tokens) tokens += u64(t.size());
      const Range range = vocab_shard(vocab, m.grid().spec.tp, r->tp_rank);
      m.memos(proc).layer_lm_head.insert({range.begin, range.end});
      step += 2 * batch * rows * (hidden + u64(range.size())) * kFloat;
      if (r->tp_rank == 0) {
        step += 2 * batch * rows * u64(vocab) * kFloat;
        outputs += 2 * batch * tokens * hidden * kFloat;
      }
    }
    m.add_phase(proc, kDlogpPhase,
                {{"references", m.references(proc)},
                 {"outputs kept", m.kept(proc)},
                 {"the layer outputs", outputs},
                 {"one chunk's rows and logits", step}});
  }
}

// One step's logit planes (dlogp_steps), a chunk's logits folded over heads (2·B·rows·V floats):
// per hosted rank the one it folds into and sends on and the one it receives, and per token
// owner the plane it took the logprobs of, kept for its next chunk. And the chunk's hidden rows
// of the rank's heads, which the CPU tile holds transposed (2·B·heads·rows·D floats). Both of
// the rank's largest chunk (a CP rank's TP ranks share chunks).
void dlogp(CaseMemory& m, int vocab) {
  const Problem& p = m.problem();
  if (p.layer) {
    layer_dlogp(m, vocab);
    return;
  }
  for (std::size_t proc = 0; proc < m.processes(); ++proc) {
    std::uint64_t partials = 0, hidden = 0;
    for (const LogicalRank* r : m.hosted(proc)) {
      for (std::int64_t h = r->q_heads.begin; h < r->q_heads.end; ++h)
        m.memos(proc).lm_head.insert({vocab, h});
      const std::uint64_t rows = u64(largest_logit_chunk(m.grid(), *r, vocab));
      partials += (r->tp_rank == 0 ? 3 : 2) * 2 * u64(p.batch) * rows * u64(vocab) * kFloat;
      hidden = std::max(
          hidden, 2 * u64(p.batch) * u64(r->q_heads.size()) * rows * u64(p.dims.head_dim) * kFloat);
    }
    m.add_phase(proc, kDlogpPhase,
                {{"references", m.references(proc)},
                 {"outputs kept", m.kept(proc)},
                 {"references cast as written", m.references(proc)},
                 {"one step's logit planes", partials},
                 {"a chunk's hidden rows, transposed", hidden}});
  }
}

// The CP=1 reference backward, shared by each TP group: round by round, every CP rank's KV heads
// of the round, from the reference forward's rows gathered there.
void reference_backward(CaseMemory& m) {
  const Problem& p = m.problem();
  const int dim = p.dims.head_dim, group = p.dims.group_size();
  const std::int64_t seq = p.seq_len;
  for (std::size_t proc = 0; proc < m.processes(); ++proc) {
    ProcessMemos& memos = m.memos(proc);
    const int threads = m.threads();
    const int per_round = static_cast<int>(std::max<std::uint64_t>(
        1, (u64(threads) + u64(group) * u64(p.batch) - 1) / (u64(group) * u64(p.batch))));
    std::uint64_t widest_round = 0;
    for (int round = 0; round < reference_rounds(m.grid(), per_round); ++round) {
      std::uint64_t here = 0;
      for (const LogicalRank* r : m.hosted(proc)) {
        const Range heads = reference_kv_heads(m.grid(), *r, round, per_round);
        if (heads.empty()) continue;
        const Range q_heads{heads.begin * group, heads.end * group};
        memos.touch(TensorId::q, p.batch, q_heads);
        memos.touch(TensorId::d_out, p.batch, q_heads);
        for (std::int64_t g = heads.begin; p.layer && g < heads.end; ++g) {
          memos.o_proj_groups.insert(g);  // the layer's dO: o_proj's columns, transposed
          memos.o_proj_transposed.insert(g);
        }
        memos.touch(TensorId::k, p.batch, heads);
        memos.touch(TensorId::v, p.batch, heads);
        const std::int64_t h = heads.size(), chunk = std::min<std::int64_t>(per_round, h);
        const std::uint64_t gathered = tensor_bytes(p.batch, group * h, seq, dim + 1);
        const std::uint64_t full =
            tensor_bytes(p.batch, group * h, seq, dim) + 2 * tensor_bytes(p.batch, h, seq, dim);
        const std::uint64_t totals = 2 * tensor_bytes(p.batch, group * chunk, seq, dim);
        const std::uint64_t dq = tensor_bytes(p.batch, group * chunk, seq, dim + 1);
        here += gathered + full + totals + dq;
        if (!m.last_case() && memos.cp1_backward_memo + full <= kCp1MemoBytes)
          memos.cp1_backward_memo += full;
      }
      widest_round = std::max(widest_round, here);
      memos.scratch_keys = std::max(memos.scratch_keys, u64(seq));
      memos.forward_keys = std::max(memos.forward_keys, u64(seq));
    }
    m.add_phase(proc, kReferenceBackwardPhase,
                {{"references", m.references(proc)},
                 {"FP32 output kept", m.references(proc)},
                 {"reference gradients",
                  each(m, proc, [](const LogicalRank&, RankSizes s) { return s.q + 2 * s.kv; })},
                 {"one round's forward rows, gradients, totals", widest_round}});
  }
}

// The distributed backward: gradients, per-head dK/dV totals kept across the rounds, the widest
// round's rows and partial dq; with the te_p2p lane, per KV block the dK/dV sums of each query CP
// rank whose queries see it, per query head, and the lane's own gradients.
void backward(CaseMemory& m, bool lane_backward) {
  const Problem& p = m.problem();
  const CaseGrid& grid = m.grid();
  const int dim = p.dims.head_dim, group = p.dims.group_size();
  for (std::size_t proc = 0; proc < m.processes(); ++proc) {
    ProcessMemos& memos = m.memos(proc);
    for (const LogicalRank* r : m.hosted(proc)) {
      for (const TensorId t : {TensorId::q, TensorId::d_out}) memos.touch(t, p.batch, r->q_heads);
      for (std::int64_t g = r->kv_heads.begin; p.layer && g < r->kv_heads.end; ++g) {
        memos.o_proj_groups.insert(g);  // the layer's dO: o_proj's columns, transposed
        memos.o_proj_transposed.insert(g);
      }
      for (const TensorId t : {TensorId::k, TensorId::v}) memos.touch(t, p.batch, r->kv_heads);
      for (const KvBlock& b : grid.blocks_of(r->cp_rank))
        memos.scratch_keys = std::max(memos.scratch_keys, u64(b.range.size()));
    }
    std::uint64_t lane_sums = 0;
    for (const LogicalRank* r : m.hosted(proc)) {
      if (!lane_backward) break;
      for (const KvBlock& kb : grid.blocks_of(r->cp_rank)) {
        std::set<int> ranks;
        for (const KvBlock& qb : grid.blocks) {
          if (causally_visible(kb.range, qb.range)) ranks.insert(qb.owner_cp_rank);
        }
        lane_sums += u64(ranks.size()) * 2 * u64(group) *
                     tensor_bytes(p.batch, r->kv_heads.size(), kb.range.size(), dim);
      }
    }
    const std::uint64_t gradients =
        each(m, proc, [](const LogicalRank&, RankSizes s) { return s.q + 2 * s.kv; });
    m.add_phase(
        proc, kBackwardPhase,
        {{"FP32 output kept", m.references(proc)},
         {"references (the layer's backward reads them)", p.layer ? m.references(proc) : 0},
         {"reference gradients", gradients},
         {"gradients (dq, dk, dv)", gradients},
         {"dK/dV totals per query head",
          each(m, proc, [&](const LogicalRank&, RankSizes s) { return 2 * u64(group) * s.kv; })},
         {"one round's rows and partial dq", m.backward_round_peak(proc)},
         {"te_p2p lane: each query rank's dK/dV sums per query head", lane_sums},
         {"te_p2p lane: its gradients", lane_backward ? gradients : 0}});
  }
}

}  // namespace phase_memory
}  // namespace cpd
