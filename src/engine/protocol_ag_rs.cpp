// ag_rs: all-gather the query rows, compute states where the K/V live, send each state to
// its query owner, merge there in global block order (a reduce-scatter whose reduction is
// the ordered merge).
#include <algorithm>
#include <cstring>
#include <map>

#include "cpdrift/core/errors.h"
#include "cpdrift/cpu/attention.h"
#include "cpdrift/engine/protocol.h"

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

namespace {

// Copies the rows of `tokens` (one of the shard's token ranges) for every (batch, head):
// the payload layout [B][heads][rows][width].
std::vector<float> rows_of(const Shard& shard, const Range& tokens) {
  const ShardShape& s = shard.shape;
  const std::int64_t first = s.local_row(tokens.begin);
  std::vector<float> payload;
  payload.reserve(static_cast<std::size_t>(s.batch) * s.heads.size() * tokens.size() * s.width);
  for (int b = 0; b < s.batch; ++b) {
    for (std::int64_t h = s.heads.begin; h < s.heads.end; ++h) {
      const float* src = shard.at(b, h, first);
      payload.insert(payload.end(), src, src + tokens.size() * s.width);
    }
  }
  return payload;
}

struct RankInputs {
  Shard q, k, v;
};

// A query range served by a KV owner: the owner's own rows or rows another rank sent.
struct ServedQuery {
  const LogicalRank* owner;
  Range tokens;
  const float* rows;  // [B][heads][tokens][D]
};

// Routes arrivals to the inbox of their destination; a destination this process does not
// host is a transport fault, reported like any manifest violation.
void deliver(std::vector<Message> arrivals, std::map<int, Inbox>& inboxes) {
  for (Message& m : arrivals) {
    const auto it = inboxes.find(m.header.dst);
    if (it == inboxes.end()) throw ProtocolError("misrouted " + describe(m.header));
    it->second.accept(std::move(m));
  }
  for (const auto& [id, inbox] : inboxes) inbox.require_complete();
}

}  // namespace

std::vector<RankOutput> run_protocol(const CaseGrid& grid, const PathSpec& path,
                                     Transport& transport, InputStore& store, bool keep_states) {
  ThreadPool& pool = store.pool();
  const Problem& problem = grid.problem;
  const int dim = problem.dims.head_dim, batch = problem.batch;
  const int group = problem.dims.group_size();
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);

  std::map<int, RankInputs> inputs;
  for (const LogicalRank& r : hosted) {
    const ShardShape qs{batch, r.q_heads, r.tokens, dim}, kvs{batch, r.kv_heads, r.tokens, dim};
    inputs[r.id] = RankInputs{store.shard(TensorId::q, qs, path.inputs),
                              store.shard(TensorId::k, kvs, path.inputs),
                              store.shard(TensorId::v, kvs, path.inputs)};
  }

  // Superstep 1: query rows go to every CP peer owning a block they can see.
  std::vector<Message> outgoing;
  for (const LogicalRank& dst_rank : grid.ranks) {
    for (const MessageHeader& h : expected_q_shards(grid, dst_rank)) {
      if (process_of(h.src, transport.world_size()) != transport.process_index()) continue;
      outgoing.push_back(Message{h, rows_of(inputs.at(h.src).q, h.tokens())});
    }
  }
  std::map<int, Inbox> q_inboxes;
  for (const LogicalRank& r : hosted) q_inboxes.emplace(r.id, Inbox(expected_q_shards(grid, r)));
  deliver(transport.exchange(std::move(outgoing)), q_inboxes);

  // Superstep 2: partial states of every served query range against the owner's blocks.
  struct Pending {
    ServedQuery query;
    KvBlock block;
    const RankInputs* kv;
  };
  std::vector<Pending> pending;
  std::vector<std::vector<float>> own_rows;  // inner buffers stay put when this grows
  for (const LogicalRank& owner : hosted) {
    std::vector<ServedQuery> served;
    for (const Range& t : owner.tokens) {
      own_rows.push_back(rows_of(inputs.at(owner.id).q, t));
      served.push_back(ServedQuery{&owner, t, own_rows.back().data()});
    }
    for (const Message& m : q_inboxes.at(owner.id).messages()) {
      served.push_back(ServedQuery{&grid.ranks[m.header.src], m.header.tokens(), m.payload.data()});
    }
    for (const ServedQuery& sq : served) {
      for (const KvBlock& block : grid.blocks_of(owner.cp_rank)) {
        if (causally_visible(block.range, sq.tokens)) {
          pending.push_back(Pending{sq, block, &inputs.at(owner.id)});
        }
      }
    }
  }
  std::vector<Message> states;
  std::vector<BlockJob> jobs;
  states.reserve(pending.size());
  for (const Pending& p : pending) {
    const MessageHeader h = state_header(grid, *p.query.owner, p.query.tokens, p.block);
    states.push_back(Message{h, std::vector<float>(static_cast<std::size_t>(h.floats))});
    float* out = states.back().payload.data();
    const std::int64_t rows = p.query.tokens.size(), heads = p.query.owner->q_heads.size();
    float* lse = out + batch * heads * rows * dim;
    const std::int64_t kv_row = p.kv->k.shape.local_row(p.block.range.begin);
    for (int b = 0; b < batch; ++b) {
      for (std::int64_t hl = 0; hl < heads; ++hl) {
        const std::int64_t g = (p.query.owner->q_heads.begin + hl) / group;
        const std::int64_t slot = b * heads + hl;
        jobs.push_back(BlockJob{p.query.rows + slot * rows * dim, p.query.tokens.begin, rows,
                                p.kv->k.at(b, g, kv_row), p.kv->v.at(b, g, kv_row), p.block.range,
                                out + slot * rows * dim, lse + slot * rows});
      }
    }
  }
  run_block_jobs(jobs, dim, problem.dims.softmax_scale(), path.rounding, pool);
  std::map<int, Inbox> state_inboxes;
  for (const LogicalRank& r : hosted) state_inboxes.emplace(r.id, Inbox(expected_states(grid, r)));
  deliver(transport.exchange(std::move(states)), state_inboxes);

  // Merge at the query owner, in global block order.
  std::vector<RankOutput> outputs;
  for (const LogicalRank& r : hosted) {
    RankOutput o{
        r, AttnShard{Shard(query_shape(grid, r, dim)), Shard(query_shape(grid, r, 1))}, {}, {}};
    const Inbox& inbox = state_inboxes.at(r.id);
    struct MergeTask {
      Range tokens;
      std::int64_t b, h;
    };
    std::vector<MergeTask> tasks;
    for (const Range& t : r.tokens) {
      for (int b = 0; b < batch; ++b) {
        for (std::int64_t h = r.q_heads.begin; h < r.q_heads.end; ++h) tasks.push_back({t, b, h});
      }
    }
    pool.parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t i) {
      const MergeTask& task = tasks[static_cast<std::size_t>(i)];
      const std::int64_t rows = task.tokens.size(), heads = r.q_heads.size();
      const std::int64_t slot = task.b * heads + (task.h - r.q_heads.begin);
      std::vector<StateRef> refs;
      for (const Message& m : inbox.messages()) {
        if (m.header.tokens() != task.tokens) continue;
        const float* out = m.payload.data();
        refs.push_back(
            StateRef{m.header.block_index, out + slot * rows * dim,
                     out + static_cast<std::int64_t>(batch) * heads * rows * dim + slot * rows});
      }
      const std::int64_t row = o.merged.out.shape.local_row(task.tokens.begin);
      merge_in_block_order(refs, rows, dim, o.merged.out.at(static_cast<int>(task.b), task.h, row),
                           o.merged.lse.at(static_cast<int>(task.b), task.h, row));
    });
    if (keep_states) {
      o.states = inbox.messages();
      o.arrival_order = inbox.arrival_order();
    }
    outputs.push_back(std::move(o));
  }
  return outputs;
}

}  // namespace cpd
