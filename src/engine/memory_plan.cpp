#include "engine/memory_plan.h"

#include <algorithm>

#include "cpdrift/production_lanes.h"
#include "engine/local_cp1.h"
#include "engine/protocol_common.h"
#include "kernels/cpu/attention.h"
#include "kernels/input_store.h"

namespace cpd {
namespace {

constexpr std::uint64_t kFloat = sizeof(float);

std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(v); }

std::int64_t rows_of(const std::vector<Range>& tokens) {
  std::int64_t n = 0;
  for (const Range& t : tokens) n += t.size();
  return n;
}

// Bytes of [batch][heads][rows][width] floats.
std::uint64_t tensor_bytes(std::int64_t batch, std::int64_t heads, std::int64_t rows,
                           std::int64_t width) {
  return u64(batch) * u64(heads) * u64(rows) * u64(width) * kFloat;
}

// A rank's query-side (q, out, dq: [B][Hq][T][D]), lse-side and KV-side (k, v, dk, dv) shards.
struct RankSizes {
  std::uint64_t q = 0, lse = 0, kv = 0;
  std::uint64_t attention() const { return q + lse; }  // out + lse
};

RankSizes sizes_of(const Problem& p, const LogicalRank& r) {
  const std::int64_t t = rows_of(r.tokens), d = p.dims.head_dim;
  return RankSizes{tensor_bytes(p.batch, r.q_heads.size(), t, d),
                   tensor_bytes(p.batch, r.q_heads.size(), t, 1),
                   tensor_bytes(p.batch, r.kv_heads.size(), t, d)};
}

std::uint64_t header_floats(const std::vector<MessageHeader>& headers) {
  std::uint64_t n = 0;
  for (const MessageHeader& h : headers) n += u64(h.floats);
  return n;
}

// Per CP rank: how many of its blocks start before each grid block (blocks sorted by
// position), and the number of grid blocks starting before position `end`.
struct BlockCounts {
  std::vector<std::vector<std::int64_t>> owned_before;
  const CaseGrid& grid;

  explicit BlockCounts(const CaseGrid& g) : grid(g) {
    owned_before.assign(static_cast<std::size_t>(g.spec.cp),
                        std::vector<std::int64_t>(g.blocks.size() + 1, 0));
    for (std::size_t i = 0; i < g.blocks.size(); ++i) {
      for (int r = 0; r < g.spec.cp; ++r) {
        owned_before[static_cast<std::size_t>(r)][i + 1] =
            owned_before[static_cast<std::size_t>(r)][i] + (g.blocks[i].owner_cp_rank == r ? 1 : 0);
      }
    }
  }
  // Blocks of CP rank `cp` that start before `end` (those a row before `end` can see).
  std::int64_t seen_by(int cp, std::int64_t end) const {
    const std::size_t seen = static_cast<std::size_t>(
        std::lower_bound(grid.blocks.begin(), grid.blocks.end(), end,
                         [](const KvBlock& b, std::int64_t e) { return b.range.begin < e; }) -
        grid.blocks.begin());
    return owned_before[static_cast<std::size_t>(cp)][seen];
  }
};

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

// The backward round of `span`: the query rows (q, dO, lse, Δ) packed by their owners and sent
// to the KV owners that see them (`rows`), and the partial dq sent back (`partials`).
struct BackwardRound {
  std::vector<std::uint64_t> own_rows, rows_received;
  std::vector<Exchange> partials;
};

BackwardRound backward_round(const CaseGrid& grid, const BlockCounts& counts, const Range& span,
                             int processes) {
  const Problem& p = grid.problem;
  const int dim = p.dims.head_dim, cp = grid.spec.cp;
  BackwardRound round{std::vector<std::uint64_t>(static_cast<std::size_t>(processes), 0),
                      std::vector<std::uint64_t>(static_cast<std::size_t>(processes), 0),
                      std::vector<Exchange>(static_cast<std::size_t>(processes))};
  for (const LogicalRank& q : grid.ranks) {
    const std::size_t home = static_cast<std::size_t>(process_of(q.id, processes));
    for (const Range& t : q.tokens) {
      const Range part = intersection(t, span);
      if (part.empty()) continue;
      const std::uint64_t packed =
          tensor_bytes(p.batch, q.q_heads.size(), part.size(), 2 * dim + 2);
      round.own_rows[home] += packed;
      for (int r = 0; r < cp; ++r) {
        if (r == q.cp_rank) continue;
        if (counts.seen_by(r, part.end) > 0)
          round.rows_received[static_cast<std::size_t>(
              process_of(grid.at(q.tp_rank, r).id, processes))] += packed;
      }
      const std::uint64_t partial = tensor_bytes(p.batch, q.q_heads.size(), part.size(), dim);
      for (int r = 0; r < cp; ++r) {
        add_message(round.partials, processes, grid.at(q.tp_rank, r).id, q.id,
                    u64(counts.seen_by(r, part.end)) * partial);
      }
    }
  }
  return round;
}

std::uint64_t sum(const std::vector<MemoryTerm>& terms) {
  std::uint64_t n = 0;
  for (const MemoryTerm& t : terms) n += t.bytes;
  return n;
}

}  // namespace

std::uint64_t PhaseMemory::bytes() const { return sum(terms); }

const PhaseMemory& ProcessMemory::peak() const {
  return *std::max_element(
      phases.begin(), phases.end(),
      [](const PhaseMemory& a, const PhaseMemory& b) { return a.bytes() < b.bytes(); });
}

void RunMemoryPlan::Memo::touch(TensorId tensor, int batch, const Range& heads) {
  for (int b = 0; b < batch; ++b) {
    for (std::int64_t h = heads.begin; h < heads.end; ++h)
      planes.insert({static_cast<int>(tensor), b, h});
  }
}

RunMemoryPlan::RunMemoryPlan(const Problem& problem, int processes, int threads)
    : problem_(problem),
      threads_(std::max(1, threads)),
      processes_(static_cast<std::size_t>(std::max(1, processes))) {}

std::vector<ProcessMemory> RunMemoryPlan::add_case(const CaseGrid& grid,
                                                   const CaseMemoryOptions& o) {
  const Problem& p = problem_;
  const int processes = static_cast<int>(processes_.size());
  const int dim = p.dims.head_dim, group = p.dims.group_size();
  const std::int64_t seq = p.seq_len;
  const BlockCounts counts(grid);
  std::vector<std::vector<const LogicalRank*>> hosted(processes_.size());
  for (const LogicalRank& r : grid.ranks)
    hosted[static_cast<std::size_t>(process_of(r.id, processes))].push_back(&r);
  const auto each = [&](std::size_t proc, auto&& fn) {
    std::uint64_t n = 0;
    for (const LogicalRank* r : hosted[proc]) n += fn(*r, sizes_of(p, *r));
    return n;
  };
  // The widest round of the forward's states and of the backward's rows and partial dq, per
  // process (every process's at once: a round is walked once).
  std::vector<std::uint64_t> forward_peaks(processes_.size(), 0),
      backward_peaks(processes_.size(), 0);
  for (int round = 0; round < grid.rounds(); ++round) {
    const std::vector<Exchange> at = forward_round(grid, counts, round, processes);
    for (std::size_t proc = 0; proc < at.size(); ++proc)
      forward_peaks[proc] = std::max(forward_peaks[proc], at[proc].peak());
  }
  if (o.backward) {
    for (const Range& span : grid.backward_rounds()) {
      const BackwardRound br = backward_round(grid, counts, span, processes);
      for (std::size_t proc = 0; proc < backward_peaks.size(); ++proc) {
        backward_peaks[proc] =
            std::max(backward_peaks[proc],
                     br.own_rows[proc] + br.rows_received[proc] + br.partials[proc].peak());
      }
    }
  }
  std::vector<ProcessMemory> out(processes_.size());
  const auto scratch = [&](Process& pr) {
    // Per kernel thread: the forward's scores [keys][64] (four lane tiles); the backward's dk,
    // dv [keys][D] (thread-local, so the longest key range any kernel has seen).
    return MemoryTerm{"kernel scratch",
                      u64(threads_) *
                          (pr.forward_keys * u64(kAttendRows) + pr.scratch_keys * u64(2 * dim)) *
                          kFloat};
  };
  const auto kv_heads_of = [&](const LogicalRank& r) {
    return Range{r.q_heads.begin / group, (r.q_heads.end - 1) / group + 1};
  };

  for (std::size_t proc = 0; proc < processes_.size(); ++proc) {
    Process& pr = processes_[proc];
    ProcessMemory& pm = out[proc];
    const auto memo_terms = [&]() {
      return std::vector<MemoryTerm>{
          {"input memo", u64(pr.memo.planes.size()) * tensor_bytes(1, 1, seq, dim)},
          {"CP=1 memos", pr.cp1_memo + pr.cp1_backward_memo},
          {"lm_head columns",
           [&] {
             std::uint64_t n = 0;
             for (const auto& [vocab, head] : pr.lm_head) n += u64(vocab) * u64(dim) * kFloat;
             return n;
           }()},
      };
    };
    const auto phase = [&](std::string name, std::vector<MemoryTerm> terms) {
      std::vector<MemoryTerm> all_terms = memo_terms();
      all_terms.push_back(scratch(pr));
      all_terms.insert(all_terms.end(), terms.begin(), terms.end());
      all_terms.push_back({"process baseline", kProcessBaselineBytes});
      pm.phases.push_back(PhaseMemory{std::move(name), std::move(all_terms)});
    };

    // The CP=1 FP32 reference forward of every hosted rank's rows (and, where its grid
    // differs, the topology counterpart): the result, its memo copy, the returned copy.
    for (const LogicalRank* r : hosted[proc]) {
      std::int64_t kv_end = 0;
      for (const Range& t : r->tokens) kv_end = std::max(kv_end, t.end);
      pr.memo.touch(TensorId::q, p.batch, r->q_heads);
      pr.memo.touch(TensorId::k, p.batch, kv_heads_of(*r));
      pr.memo.touch(TensorId::v, p.batch, kv_heads_of(*r));
      pr.forward_keys = std::max(pr.forward_keys, u64(kv_end));
    }
    const std::uint64_t references =
        each(proc, [](const LogicalRank&, RankSizes s) { return s.attention(); });
    const bool memoise = !o.last_case && pr.cp1_memo + references <= kCp1MemoBytes;
    phase("CP=1 reference forward",
          {{"references", references}, {"reference being computed", references}});
    if (memoise) pr.cp1_memo += references;

    // The forward paths, each one exchange; the FP32 path first, with the merge checks.
    std::uint64_t kept = 0;  // outputs kept from earlier paths
    for (std::size_t k = 0; k < o.paths.size(); ++k) {
      const bool fp32 = o.paths[k].kind == ForwardPathKind::fp32;
      for (const LogicalRank* r : hosted[proc]) {
        pr.memo.touch(TensorId::q, p.batch, r->q_heads);
        pr.memo.touch(TensorId::k, p.batch, r->kv_heads);
        pr.memo.touch(TensorId::v, p.batch, r->kv_heads);
      }
      std::uint64_t exchanged = 0;
      for (const LogicalRank* r : hosted[proc]) {
        switch (grid.spec.protocol) {
          case Protocol::ag_rs:
            exchanged += header_floats(expected_q_shards(grid, *r)) * kFloat;
            break;
          case Protocol::allgather_kv:
            exchanged += 2 * header_floats(expected_kv_allgather(grid, *r)) * kFloat;
            break;
          case Protocol::ring_kv: {
            std::uint64_t pieces = 0, widest = 0;
            for (int step = 1; step < grid.spec.cp; ++step) {
              const std::uint64_t n = header_floats(expected_kv_ring(grid, *r, step)) * kFloat;
              pieces += n;
              widest = std::max(widest, n);
            }
            exchanged += pieces + widest;
            break;
          }
        }
      }
      const std::uint64_t round_peak = forward_peaks[proc];
      // FP32: the output, the probe's and the oracle's; BF16 kernel: the output and the lanes'.
      const bool lanes = o.paths[k].kind == ForwardPathKind::bf16_kernel;
      const std::uint64_t copies = fp32 ? 3 : lanes ? 1 + kProductionLanes.size() : 1;
      const std::uint64_t outputs =
          each(proc, [&](const LogicalRank&, RankSizes s) { return copies * s.attention(); });
      // The lanes' per-rank folds of kLaneRows rows (merge_production_lanes), one at a time.
      std::uint64_t lane_folds = 0;
      for (const LogicalRank* r : hosted[proc]) {
        if (!lanes) break;
        std::int64_t rows = 0;
        for (const Range& t : r->tokens)
          rows = std::max(rows, std::min(t.size(), protocol::kLaneRows));
        lane_folds =
            std::max(lane_folds, u64(grid.spec.cp) * u64(p.batch) * u64(r->q_heads.size()) *
                                     u64(rows) * u64(dim + 1) * kFloat);
      }
      const auto own_query_rows = [&](const LogicalRank& r, RankSizes s) -> std::uint64_t {
        return protocol::serves_own_rows_in_place(grid.spec.protocol, r) ? 0 : s.q;
      };
      phase(std::string("forward: ") + o.paths[k].name,
            {{"references", references},
             {"outputs of earlier paths", kept},
             {"path inputs (q, k, v)",
              each(proc, [](const LogicalRank&, RankSizes s) { return s.q + 2 * s.kv; })},
             {"own query rows", each(proc, own_query_rows)},
             {grid.spec.protocol == Protocol::ag_rs ? "query rows received" : "K/V received",
              exchanged},
             {fp32    ? "outputs, merge-order probe, FP64 oracle"
              : lanes ? "outputs, production lanes"
                      : "outputs",
              outputs},
             {"one round's states", round_peak},
             {"production lanes' per-rank folds", lane_folds}});
      for (const LogicalRank* r : hosted[proc]) {
        for (const KvBlock& b : grid.blocks_of(r->cp_rank))
          pr.forward_keys = std::max(pr.forward_keys, u64(b.range.size()));
      }
      // Kept: the FP32 path's output (for the backward) and the dtype path's (for dlogp).
      if (fp32 || o.paths[k].kind == ForwardPathKind::bf16_inputs) kept += references;
    }

    if (o.vocab > 0) {
      // One step's logit planes (dlogp_steps), a chunk's logits folded over heads (2·B·rows·V
      // floats): per hosted rank the one it folds into and sends on and the one it receives,
      // and per token owner the plane it took the logprobs of, kept for its next chunk. And the
      // chunk's hidden rows of the rank's heads, which the CPU tile holds transposed (2·B·heads·
      // rows·D floats). Both of the rank's largest chunk (a CP rank's TP ranks share chunks).
      std::uint64_t partials = 0, hidden = 0;
      for (const LogicalRank* r : hosted[proc]) {
        for (std::int64_t h = r->q_heads.begin; h < r->q_heads.end; ++h)
          pr.lm_head.insert({o.vocab, h});
        const std::uint64_t rows = u64(largest_logit_chunk(grid, *r, o.vocab));
        partials += (r->tp_rank == 0 ? 3 : 2) * 2 * u64(p.batch) * rows * u64(o.vocab) * kFloat;
        hidden = std::max(hidden, 2 * u64(p.batch) * u64(r->q_heads.size()) * rows *
                                      u64(p.dims.head_dim) * kFloat);
      }
      phase("dlogp", {{"references", references},
                      {"outputs kept", kept},
                      {"references cast as written", references},
                      {"one step's logit planes", partials},
                      {"a chunk's hidden rows, transposed", hidden}});
    }
    if (!o.backward) continue;
    const std::uint64_t fp32_out = references;  // the FP32 path's output, same shape

    // The CP=1 reference backward, shared by each TP group: round by round, every CP rank's
    // KV heads of the round, from the reference forward's rows gathered there.
    const std::uint64_t per_round_threads = static_cast<std::uint64_t>(threads_);
    const int per_round = static_cast<int>(std::max<std::uint64_t>(
        1, (per_round_threads + u64(group) * u64(p.batch) - 1) / (u64(group) * u64(p.batch))));
    const std::uint64_t results =
        each(proc, [](const LogicalRank&, RankSizes s) { return s.q + 2 * s.kv; });
    std::uint64_t widest_round = 0;
    for (int round = 0; round < reference_rounds(grid, per_round); ++round) {
      std::uint64_t here = 0;
      for (const LogicalRank* r : hosted[proc]) {
        const Range heads = reference_kv_heads(grid, *r, round, per_round);
        if (heads.empty()) continue;
        const Range q_heads{heads.begin * group, heads.end * group};
        pr.memo.touch(TensorId::q, p.batch, q_heads);
        pr.memo.touch(TensorId::d_out, p.batch, q_heads);
        pr.memo.touch(TensorId::k, p.batch, heads);
        pr.memo.touch(TensorId::v, p.batch, heads);
        const std::int64_t h = heads.size(), chunk = std::min<std::int64_t>(per_round, h);
        const std::uint64_t gathered = tensor_bytes(p.batch, group * h, seq, dim + 1);
        const std::uint64_t full =
            tensor_bytes(p.batch, group * h, seq, dim) + 2 * tensor_bytes(p.batch, h, seq, dim);
        const std::uint64_t totals = 2 * tensor_bytes(p.batch, group * chunk, seq, dim);
        const std::uint64_t dq = tensor_bytes(p.batch, group * chunk, seq, dim + 1);
        here += gathered + full + totals + dq;
        if (!o.last_case && pr.cp1_backward_memo + full <= kCp1MemoBytes)
          pr.cp1_backward_memo += full;
      }
      widest_round = std::max(widest_round, here);
      pr.scratch_keys = std::max(pr.scratch_keys, u64(seq));
      pr.forward_keys = std::max(pr.forward_keys, u64(seq));
    }
    phase("backward: CP=1 reference",
          {{"references", references},
           {"FP32 output kept", fp32_out},
           {"reference gradients", results},
           {"one round's forward rows, gradients, totals", widest_round}});

    // The distributed backward: gradients, per-head dK/dV totals kept across the rounds, and
    // the widest round's rows and partial dq.
    for (const LogicalRank* r : hosted[proc]) {
      for (const TensorId t : {TensorId::q, TensorId::d_out}) pr.memo.touch(t, p.batch, r->q_heads);
      for (const TensorId t : {TensorId::k, TensorId::v}) pr.memo.touch(t, p.batch, r->kv_heads);
      for (const KvBlock& b : grid.blocks_of(r->cp_rank))
        pr.scratch_keys = std::max(pr.scratch_keys, u64(b.range.size()));
    }
    const std::uint64_t round_peak = backward_peaks[proc];
    // The te_p2p lane: per KV block, the dK/dV sums of each query CP rank whose queries see it,
    // per query head; and the lane's own gradients.
    std::uint64_t lane_sums = 0;
    if (o.lane_backward) {
      for (const LogicalRank* r : hosted[proc]) {
        for (const KvBlock& kb : grid.blocks_of(r->cp_rank)) {
          std::set<int> ranks;
          for (const KvBlock& qb : grid.blocks) {
            if (causally_visible(kb.range, qb.range)) ranks.insert(qb.owner_cp_rank);
          }
          lane_sums += u64(ranks.size()) * 2 * u64(group) *
                       tensor_bytes(p.batch, r->kv_heads.size(), kb.range.size(), dim);
        }
      }
    }
    phase("backward",
          {{"FP32 output kept", fp32_out},
           {"reference gradients", results},
           {"gradients (dq, dk, dv)", results},
           {"dK/dV totals per query head",
            each(proc, [&](const LogicalRank&, RankSizes s) { return 2 * u64(group) * s.kv; })},
           {"one round's rows and partial dq", round_peak},
           {"te_p2p lane: each query rank's dK/dV sums per query head", lane_sums},
           {"te_p2p lane: its gradients", o.lane_backward ? results : 0}});
  }
  return out;
}

std::uint64_t process_memory_floor(const RunRequest& request, const RunPlan& plan, int processes) {
  const Problem& p = request.problem;
  std::uint64_t floor = 0;
  for (const CaseSpec& spec : plan.cases) {
    if (spec.num_logical_ranks() < processes) continue;
    floor = std::max(
        floor, tensor_bytes(p.batch, p.dims.num_q_heads / spec.tp, p.seq_len, p.dims.head_dim));
  }
  return floor == 0 ? 0 : floor + kProcessBaselineBytes;
}

std::vector<std::uint64_t> plan_run_peaks(const RunRequest& request, const RunPlan& plan,
                                          int processes, int threads, bool gpu) {
  const Problem& p = request.problem;
  RunMemoryPlan memory(p, processes, threads);
  std::vector<std::uint64_t> peaks(static_cast<std::size_t>(std::max(1, processes)), 0);
  for (std::size_t i = 0; i < plan.cases.size(); ++i) {
    const CaseGrid grid(p, plan.cases[i], request.round_rows);
    const std::vector<ProcessMemory> m = memory.add_case(
        grid, CaseMemoryOptions{
                  forward_paths(p.dtype, gpu, gpu && request.cpu_check), request.include_backward,
                  request.include_dlogp ? request.vocab_size : 0,
                  i + 1 == plan.cases.size() && plan.paged.empty(), request.include_lane_backward});
    for (std::size_t proc = 0; proc < m.size(); ++proc)
      peaks[proc] = std::max(peaks[proc], m[proc].peak().bytes());
  }
  return peaks;
}

}  // namespace cpd
