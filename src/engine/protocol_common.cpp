#include "engine/protocol_common.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "core/util/work_timers.h"
#include "cpdrift/production_lanes.h"
#include "engine/merge_checks.h"
#include "kernels/attention_backend.h"

namespace cpd {

ShardShape query_shape(const CaseGrid& grid, const LogicalRank& rank, int width) {
  return ShardShape{grid.problem.batch, rank.q_heads, rank.tokens, width};
}

std::vector<LogicalRank> hosted_ranks(const CaseGrid& grid, const Transport& transport) {
  std::vector<LogicalRank> hosted;
  for (const LogicalRank& r : grid.ranks) {
    if (process_of(r.id, transport.world_size()) == transport.process_index()) hosted.push_back(r);
  }
  return hosted;
}

std::vector<RankOutput> run_protocol(const CaseGrid& grid, const PathSpec& path,
                                     Transport& transport, InputStore& inputs, MergeExtras extras) {
  switch (grid.spec.protocol) {
    case Protocol::ag_rs:
      return protocol::run_ag_rs(grid, path, transport, inputs, extras);
    case Protocol::ring_kv:
    case Protocol::allgather_kv:
      return protocol::run_kv_protocol(grid, path, transport, inputs, extras);
  }
  throw std::logic_error("unknown protocol");
}

namespace protocol {

namespace {

// Copies rows `tokens` of every (batch, head) of `shard` to `to`, [B][heads][rows][width].
void copy_rows_to(const Shard& shard, const Range& tokens, float* to, ThreadPool& pool) {
  const ShardShape& s = shard.shape;
  const std::int64_t first = s.local_row(tokens.begin), heads = s.heads.size();
  const std::size_t n = static_cast<std::size_t>(tokens.size()) * s.width;
  pool.parallel_for(s.batch * heads, [&](std::int64_t i) {
    const int b = static_cast<int>(i / heads);
    std::memcpy(to + static_cast<std::size_t>(i) * n, shard.at(b, s.heads.begin + i % heads, first),
                n * sizeof(float));
  });
}

// The partial state of the rows `group` of `w`'s query range against `block` (whose K/V rows
// w.k, w.v hold) as a message to the query's owner; the jobs that fill its payload (every float)
// are appended to `jobs` (run them before the payload is read). Messages can be moved freely:
// jobs point into the payload buffer.
Message state_message(const CaseGrid& grid, const StateWork& w, const Range& group,
                      const KvBlock& block, std::vector<BlockJob>& jobs) {
  const int dim = grid.problem.dims.head_dim, batch = grid.problem.batch;
  const int gqa = grid.problem.dims.group_size();
  const MessageHeader h = state_header(grid, *w.owner, group, block);
  Message m{h, unwritten_floats(static_cast<std::size_t>(h.floats))};
  float* out = m.payload.data();
  const std::int64_t rows = group.size(), heads = w.owner->q_heads.size();
  float* lse = out + batch * heads * rows * dim;
  const std::int64_t kv_row = w.k->shape.local_row(block.range.begin);
  for (int b = 0; b < batch; ++b) {
    for (std::int64_t hl = 0; hl < heads; ++hl) {
      const std::int64_t g = (w.owner->q_heads.begin + hl) / gqa;
      const std::int64_t slot = b * heads + hl;
      const float* q = w.rows + (slot * w.tokens.size() + group.begin - w.tokens.begin) * dim;
      jobs.push_back(BlockJob{q, group.begin, rows, w.k->at(b, g, kv_row), w.v->at(b, g, kv_row),
                              block.range, out + slot * rows * dim, lse + slot * rows});
    }
  }
  return m;
}

// Partial states of `jobs` with the path's kernel.
void run_state_jobs(const CaseGrid& grid, const PathSpec& path, std::span<const BlockJob> jobs,
                    AttentionBackend& backend) {
  const int dim = grid.problem.dims.head_dim;
  const float scale = grid.problem.dims.softmax_scale();
  if (path.kernel == BlockKernel::cublas_unfused) {
    backend.run_unfused_jobs(jobs, dim, scale);
  } else {
    backend.run_block_jobs(jobs, dim, scale, path.rounding);
  }
}

// Checks what `arrivals` returns into the inboxes and every inbox complete, then agrees.
// `arrivals` may throw (a malformed buffer) and is called inside the guard, so every process
// reaches agree().
template <class Arrivals>
std::map<int, Inbox> receive(Transport& transport, const std::vector<LogicalRank>& hosted,
                             const Manifest& expected, Arrivals&& arrivals) {
  const WorkTimer t(WorkKind::messages);
  std::map<int, Inbox> inboxes;
  for (const LogicalRank& r : hosted) inboxes.emplace(r.id, Inbox(expected(r)));
  std::string error;
  try {
    for (Message& m : arrivals()) {
      const auto it = inboxes.find(m.header.dst);
      if (it == inboxes.end()) throw ProtocolError("misrouted " + describe(m.header));
      it->second.accept(std::move(m));
    }
    for (const auto& [id, inbox] : inboxes) inbox.require_complete();
  } catch (const ProtocolError& e) {
    error = "process " + std::to_string(transport.process_index()) + ": " + e.what();
  }
  error = transport.agree(error);
  if (!error.empty()) throw ProtocolError(error);
  return inboxes;
}

// Merge jobs for the rows `groups` (the round's groups of a rank's ranges) of a rank's query
// shard `into` from `states` (taken in `order`, indices into `states`; the merge sorts them by
// block index anyway).
std::vector<MergeJob> state_merge_jobs(const AttnShard& into, const LogicalRank& r,
                                       const std::vector<Range>& groups,
                                       const std::vector<Message>& states,
                                       const std::vector<std::size_t>& order, int batch, int dim) {
  std::vector<MergeJob> jobs;
  const std::int64_t heads = r.q_heads.size();
  jobs.reserve(groups.size() * static_cast<std::size_t>(batch * heads));
  for (const Range& t : groups) {
    const std::int64_t rows = t.size(), row = into.out.shape.local_row(t.begin);
    const auto covering = std::count_if(states.begin(), states.end(),
                                        [&](const Message& m) { return m.header.tokens() == t; });
    for (int b = 0; b < batch; ++b) {
      for (std::int64_t h = r.q_heads.begin; h < r.q_heads.end; ++h) {
        const std::int64_t slot = b * heads + (h - r.q_heads.begin);
        MergeJob job;
        job.states.reserve(static_cast<std::size_t>(covering));
        for (std::size_t i : order) {
          const Message& m = states[i];
          if (m.header.tokens() != t) continue;
          const float* out = m.payload.data();
          job.states.push_back(StateRef{m.header.block_index, out + slot * rows * dim,
                                        out + batch * heads * rows * dim + slot * rows});
        }
        job.rows = rows;
        job.out = const_cast<float*>(into.out.at(b, h, row));
        job.lse = const_cast<float*>(into.lse.at(b, h, row));
        jobs.push_back(std::move(job));
      }
    }
  }
  return jobs;
}

// The hosted ranks' outputs before the first round: rows unwritten, which the rounds' merges
// write (and checks and lanes when asked).
std::vector<RankOutput> start_outputs(const CaseGrid& grid, const std::vector<LogicalRank>& hosted,
                                      MergeExtras extras) {
  const int dim = grid.problem.dims.head_dim;
  std::vector<RankOutput> outputs;
  for (const LogicalRank& r : hosted) {
    const ShardShape out = query_shape(grid, r, dim);
    // Unwritten: the rounds' merges write every row (each round's groups, all rounds together
    // the rank's tokens), and so do the probe's and the production lanes'.
    RankOutput o{r, AttnShard::unwritten(out), std::nullopt, {}, {}};
    if (extras.checks) {
      // The oracle's diffs too: each round's checks write its rows.
      o.checks = MergeChecks{AttnShard::unwritten(out), unwritten_floats(out.size()),
                             unwritten_floats(query_shape(grid, r, 1).size())};
    }
    if (extras.lanes) {
      for (std::size_t k = 0; k < kProductionLanes.size(); ++k)
        o.lanes.push_back(AttnShard::unwritten(out));
    }
    outputs.push_back(std::move(o));
  }
  return outputs;
}

// Round `round` of every hosted rank (outputs[i] is hosted[i]'s): its validated states merged in
// global block order into its rows of the round; the production lanes and the merge checks of
// the same states when the outputs carry them, and the states' headers with the checks.
void merge_round(const CaseGrid& grid, int round, const std::vector<LogicalRank>& hosted,
                 std::map<int, Inbox>& inboxes, InputStore& store,
                 std::vector<RankOutput>& outputs) {
  AttentionBackend& backend = store.backend();
  const int dim = grid.problem.dims.head_dim, batch = grid.problem.batch;
  for (std::size_t i = 0; i < hosted.size(); ++i) {
    const LogicalRank& r = hosted[i];
    RankOutput& o = outputs[i];
    const Inbox& inbox = inboxes.at(r.id);
    const std::vector<Message>& states = inbox.messages();
    std::vector<Range> groups;
    for (const Range& t : r.tokens) {
      if (const Range g = grid.round_group(t, round); !g.empty()) groups.push_back(g);
    }
    std::vector<std::size_t> manifest_order(states.size());
    for (std::size_t j = 0; j < manifest_order.size(); ++j) manifest_order[j] = j;
    const std::vector<MergeJob> jobs =
        state_merge_jobs(o.merged, r, groups, states, manifest_order, batch, dim);
    backend.merge_states(jobs, dim);
    if (!o.lanes.empty())
      merge_production_lanes(grid, r, groups, states, backend, store.pool(), o.lanes);
    if (!o.checks) continue;
    // The merge-order probe: the same states merged from the reverse of their arrival order.
    const std::vector<std::size_t>& arrival = inbox.arrival_order();
    backend.merge_states(state_merge_jobs(o.checks->probe, r, groups, states,
                                          {arrival.rbegin(), arrival.rend()}, batch, dim),
                         dim);
    {
      const WorkTimer t(WorkKind::checks);
      merge_oracle_diffs(jobs, o.merged, dim, store.pool(), *o.checks);
    }
    for (const Message& m : states) o.merged_states.push_back(m.header);
  }
}

}  // namespace

std::map<int, RankInputs> generate_inputs(const CaseGrid& grid,
                                          const std::vector<LogicalRank>& hosted,
                                          const PathSpec& path, InputStore& store) {
  const int dim = grid.problem.dims.head_dim, batch = grid.problem.batch;
  std::map<int, RankInputs> inputs;
  for (const LogicalRank& r : hosted) {
    const ShardShape qs{batch, r.q_heads, r.tokens, dim}, kvs{batch, r.kv_heads, r.tokens, dim};
    inputs[r.id] = RankInputs{store.shard(TensorId::q, qs, path.inputs),
                              store.shard(TensorId::k, kvs, path.inputs),
                              store.shard(TensorId::v, kvs, path.inputs)};
  }
  return inputs;
}

FloatBuffer rows_of(const Shard& shard, const Range& tokens, ThreadPool& pool) {
  const ShardShape& s = shard.shape;
  FloatBuffer payload = unwritten_floats(static_cast<std::size_t>(s.batch) * s.heads.size() *
                                         tokens.size() * s.width);
  copy_rows_to(shard, tokens, payload.data(), pool);  // every element
  return payload;
}

FloatBuffer kv_payload(const Shard& k, const Shard& v, const Range& tokens, ThreadPool& pool) {
  const std::size_t half = static_cast<std::size_t>(k.shape.batch) * k.shape.heads.size() *
                           tokens.size() * k.shape.width;
  FloatBuffer payload = unwritten_floats(2 * half);
  copy_rows_to(k, tokens, payload.data(), pool);  // every element, K then V
  copy_rows_to(v, tokens, payload.data() + half, pool);
  return payload;
}

std::map<int, Inbox> superstep(Transport& transport, const std::vector<LogicalRank>& hosted,
                               std::vector<Message> outgoing, const Manifest& expected) {
  return receive(transport, hosted, expected, [&] {
    transport.start(std::move(outgoing));
    return transport.finish();
  });
}

std::map<int, Inbox> exchange(const CaseGrid& grid, Transport& transport,
                              const std::vector<LogicalRank>& hosted, const Manifest& expected,
                              const std::function<FloatBuffer(const MessageHeader&)>& payload) {
  std::vector<Message> outgoing;
  for (const LogicalRank& dst : grid.ranks) {
    for (const MessageHeader& h : expected(dst)) {
      if (process_of(h.src, transport.world_size()) == transport.process_index())
        outgoing.push_back(Message{h, payload(h)});
    }
  }
  return superstep(transport, hosted, std::move(outgoing), expected);
}

std::vector<RankOutput> state_rounds(const CaseGrid& grid, const PathSpec& path,
                                     Transport& transport, InputStore& store,
                                     const std::vector<LogicalRank>& hosted,
                                     const std::vector<StateWork>& work, MergeExtras extras) {
  std::vector<RankOutput> outputs = start_outputs(grid, hosted, extras);
  for (int round = 0; round < grid.rounds(); ++round) {
    std::vector<Message> states;
    std::vector<BlockJob> jobs;
    for (const StateWork& w : work) {
      const Range group = grid.round_group(w.tokens, round);
      if (group.empty()) continue;
      for (const KvBlock& block : grid.blocks) {
        const bool held = std::any_of(w.k->shape.tokens.begin(), w.k->shape.tokens.end(),
                                      [&](const Range& t) { return t.contains(block.range); });
        if (held && causally_visible(block.range, group))
          states.push_back(state_message(grid, w, group, block, jobs));
      }
    }
    run_state_jobs(grid, path, jobs, store.backend());
    const Manifest expected = [&](const LogicalRank& r) { return expected_states(grid, r, round); };
    // Under ring_kv and allgather_kv the states were computed here, but they are checked
    // against the same manifest.
    std::map<int, Inbox> inboxes =
        grid.spec.protocol == Protocol::ag_rs
            ? superstep(transport, hosted, std::move(states), expected)
            : receive(transport, hosted, expected, [&] { return std::move(states); });
    merge_round(grid, round, hosted, inboxes, store, outputs);
  }
  return outputs;
}

}  // namespace protocol
}  // namespace cpd
