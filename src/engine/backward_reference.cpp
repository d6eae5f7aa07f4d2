// The CP=1 reference backward, computed by whoever needs it from the memoised inputs: one block
// pair [0, S) × [0, S), from the CP=1 FP32 forward, a few GQA groups at a time.
#include <algorithm>
#include <stdexcept>

#include "cpdrift/attention_backward_math.h"
#include "engine/backward.h"
#include "engine/protocol_common.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/attention_backward.h"

namespace cpd {
namespace {

// The gradients of `q_rows` and `kv_rows` for the KV heads `kv_heads` (a chunk of the rows'
// KV heads): the reference's rows [first, S) against keys [0, S) (the dq of those rows is
// complete, rows being independent, and so are the dk, dv of keys from `first` on, which
// earlier rows cannot see), in place from the input memo. The CP=1 forward of those rows is
// `forward`'s where given (it holds them), else computed here. `totals` and `dq` are scratch.
void backward_chunk(InputStore& inputs, const Range& kv_heads, std::int64_t first,
                    const ShardShape& q_rows, const ShardShape& kv_rows, const AttnShard* forward,
                    std::vector<FloatBuffer>& totals, LocalCp1Backward::Result& r) {
  const Problem& p = inputs.problem();
  const int dim = p.dims.head_dim, group = p.dims.group_size(), batch = p.batch;
  const float scale = p.dims.softmax_scale();
  const Range heads{kv_heads.begin * group, kv_heads.end * group}, rows{first, p.seq_len},
      keys{0, p.seq_len};
  const ShardShape qs{batch, heads, {rows}, dim};
  const AttnShard computed =
      forward != nullptr ? AttnShard{} : compute_local_cp1(inputs, PathSpec{}, {keys}, qs);
  const AttnShard& fwd = forward != nullptr ? *forward : computed;
  const std::int64_t fwd_row = fwd.out.shape.local_row(first);
  // Written whole: delta below, dq by the units (one query block of every row).
  Shard delta(ShardShape{batch, heads, {rows}, 1}, Uninitialized{}), dq(qs, Uninitialized{});
  std::vector<BackwardUnit> units;  // per (b, h); the memo's rows looked up on this thread
  for (int b = 0; b < batch; ++b) {
    for (std::int64_t h = heads.begin; h < heads.end; ++h) {
      const float* d_out = inputs.row(TensorId::d_out, b, h, first);
      float* d = delta.at(b, h, 0);
      const std::size_t slot = 2 * units.size();
      BackwardUnit u;
      u.blocks.push_back(QueryBlockRows{rows, inputs.row(TensorId::q, b, h, first), d_out,
                                        fwd.lse.at(b, h, fwd_row), d, dq.at(b, h, 0)});
      u.k = inputs.row(TensorId::k, b, h / group, 0);
      u.v = inputs.row(TensorId::v, b, h / group, 0);
      u.keys = keys;
      u.dk_total = totals[slot].data();
      u.dv_total = totals[slot + 1].data();
      units.push_back(std::move(u));
    }
  }
  ThreadPool& pool = inputs.pool();
  pool.parallel_for(static_cast<std::int64_t>(units.size()), [&](std::int64_t i) {
    const int b = static_cast<int>(i / heads.size());
    const std::int64_t h = heads.begin + i % heads.size();
    const float* d_out = units[static_cast<std::size_t>(i)].blocks.front().d_out;
    const float* out = fwd.out.at(b, h, fwd_row);
    float* d = delta.at(b, h, 0);
    for (std::int64_t k = 0; k < rows.size(); ++k)
      d[k] = backward_delta(d_out + k * dim, out + k * dim, dim);
  });
  inputs.backend().run_backward_units(units, dim, scale);
  // dq: one block, so the fold of one term is the term; then the scale. A (b, h) a task.
  pool.parallel_for(static_cast<std::int64_t>(units.size()), [&](std::int64_t i) {
    const int b = static_cast<int>(i / heads.size());
    const std::int64_t h = heads.begin + i % heads.size();
    for (const Range& t : q_rows.tokens) {
      const float* from = dq.at(b, h, t.begin - first);
      float* to = r.dq.at(b, h, q_rows.local_row(t.begin));
      for (std::int64_t e = 0; e < t.size() * dim; ++e) to[e] = from[e] * scale;
    }
  });
  // dK, dV: the GQA group's heads folded in ascending order; dK carries the scale. Elements
  // are independent: pieces of rows are tasks.
  struct Fold {
    std::vector<const float*> dk_terms, dv_terms;
    std::size_t n;
    float *dk, *dv;
  };
  std::vector<Fold> folds;
  std::size_t unit = 0;
  for (int b = 0; b < batch; ++b) {
    for (std::int64_t g = kv_heads.begin; g < kv_heads.end; ++g, unit += group) {
      for (const Range& t : kv_rows.tokens) {
        const std::size_t skip = static_cast<std::size_t>(t.begin) * dim;
        const std::int64_t row = kv_rows.local_row(t.begin);
        Fold& f = folds.emplace_back(Fold{{},
                                          {},
                                          static_cast<std::size_t>(t.size()) * dim,
                                          r.dk.at(b, g, row),
                                          r.dv.at(b, g, row)});
        for (int x = 0; x < group; ++x) {
          f.dk_terms.push_back(totals[2 * (unit + x)].data() + skip);
          f.dv_terms.push_back(totals[2 * (unit + x) + 1].data() + skip);
        }
      }
    }
  }
  constexpr std::size_t kPiece = std::size_t{64} * 128;     // floats a task
  std::vector<std::pair<std::size_t, std::size_t>> pieces;  // (fold, first element)
  for (std::size_t f = 0; f < folds.size(); ++f) {
    for (std::size_t e = 0; e < folds[f].n; e += kPiece) pieces.emplace_back(f, e);
  }
  pool.parallel_for(static_cast<std::int64_t>(pieces.size()), [&](std::int64_t i) {
    const auto [fi, e] = pieces[static_cast<std::size_t>(i)];
    const Fold& f = folds[fi];
    const std::size_t n = std::min(kPiece, f.n - e);
    fold_terms(f.dk_terms, n, f.dk + e, e);
    for (std::size_t j = 0; j < n; ++j) f.dk[e + j] *= scale;
    fold_terms(f.dv_terms, n, f.dv + e, e);
  });
}

// Copies rows `tokens` of heads `heads` of `s` to `at`, [B][heads][rows][width]: a payload
// piece; returns what follows it.
float* put_rows(const Shard& s, const Range& heads, const Range& tokens, float* at) {
  const std::int64_t row = s.shape.local_row(tokens.begin), n = tokens.size() * s.shape.width;
  for (int b = 0; b < s.shape.batch; ++b) {
    for (std::int64_t h = heads.begin; h < heads.end; ++h, at += n) {
      const float* from = s.at(b, h, row);
      std::copy(from, from + n, at);
    }
  }
  return at;
}

// The inverse of put_rows: reads the piece at `at` into `s`; returns what follows it.
const float* take_rows(const float* at, Shard& s, const Range& heads, const Range& tokens) {
  const std::int64_t row = s.shape.local_row(tokens.begin), n = tokens.size() * s.shape.width;
  for (int b = 0; b < s.shape.batch; ++b) {
    for (std::int64_t h = heads.begin; h < heads.end; ++h, at += n)
      std::copy(at, at + n, s.at(b, h, row));
  }
  return at;
}

// The query heads of KV head g's GQA group.
Range group_heads(std::int64_t g, std::int64_t group) { return Range{g * group, (g + 1) * group}; }

// The rows `tokens` of a whole-sequence result of KV head g's group, packed as the
// reference_grads payload: dq [B][group][rows][D], then dk, dv [B][rows][D].
void pack_reference(const LocalCp1Backward::Result& full, std::int64_t g, std::int64_t group,
                    const Range& tokens, float* payload) {
  payload = put_rows(full.dq, group_heads(g, group), tokens, payload);
  payload = put_rows(full.dk, Range{g, g + 1}, tokens, payload);
  put_rows(full.dv, Range{g, g + 1}, tokens, payload);
}

void unpack_reference(const Message& m, std::int64_t group, LocalCp1Backward::Result& into) {
  const std::int64_t g = m.header.head_begin;
  const Range tokens = m.header.tokens();
  const float* at = take_rows(m.payload.data(), into.dq, group_heads(g, group), tokens);
  at = take_rows(at, into.dk, Range{g, g + 1}, tokens);
  take_rows(at, into.dv, Range{g, g + 1}, tokens);
}

// The rows round `round` of the shared reference backward starts from: each hosted rank's
// CP=1 forward (`reference`) sent, per KV head of the round, to the CP rank of its TP group
// that computes it. Per hosted rank, the out and lse of its round's query heads, whole
// sequence (no heads when it computes none).
std::vector<AttnShard> gather_round_forward(const CaseGrid& grid, Transport& transport,
                                            const std::vector<LogicalRank>& hosted,
                                            const std::vector<const AttnShard*>& reference,
                                            int round, int per_round, ThreadPool& pool) {
  const Problem& p = grid.problem;
  const int dim = p.dims.head_dim, batch = p.batch;
  const std::int64_t group = p.dims.group_size();
  std::map<int, const AttnShard*> rows_of;  // the hosted ranks' forward rows
  for (std::size_t i = 0; i < hosted.size(); ++i) rows_of[hosted[i].id] = reference[i];
  std::map<int, Inbox> inboxes = protocol::exchange(
      grid, transport, hosted,
      [&](const LogicalRank& dst) {
        return expected_reference_forward(grid, dst, round, per_round);
      },
      [&](const MessageHeader& h) {
        FloatBuffer payload = unwritten_floats(static_cast<std::size_t>(h.floats));  // all written
        const AttnShard& rows = *rows_of.at(h.src);
        const Range heads = group_heads(h.head_begin, group), t = h.tokens();
        put_rows(rows.lse, heads, t, put_rows(rows.out, heads, t, payload.data()));
        return payload;
      });
  // Every row of a rank's round heads comes from one message: the TP group's ranks hold the
  // whole sequence between them.
  std::vector<AttnShard> out;
  std::vector<std::pair<const Message*, AttnShard*>> unpack;
  out.reserve(hosted.size());
  for (const LogicalRank& r : hosted) {
    const Range block = reference_kv_heads(grid, r, round, per_round);
    const Range heads{block.begin * group, block.end * group}, all{0, p.seq_len};
    AttnShard& f =
        out.emplace_back(AttnShard{Shard(ShardShape{batch, heads, {all}, dim}, Uninitialized{}),
                                   Shard(ShardShape{batch, heads, {all}, 1}, Uninitialized{})});
    for (const Message& m : inboxes.at(r.id).messages()) unpack.emplace_back(&m, &f);
  }
  // Unpacked a message a task: each writes its own rows.
  pool.parallel_for(static_cast<std::int64_t>(unpack.size()), [&](std::int64_t k) {
    const auto [m, f] = unpack[static_cast<std::size_t>(k)];
    const Range heads = group_heads(m->header.head_begin, group), t = m->header.tokens();
    take_rows(take_rows(m->payload.data(), f->out, heads, t), f->lse, heads, t);
  });
  return out;
}

}  // namespace

std::shared_ptr<const LocalCp1Backward::Result> LocalCp1Backward::get(InputStore& inputs,
                                                                      const ShardShape& q_rows,
                                                                      const ShardShape& kv_rows,
                                                                      const AttnShard* forward) {
  for (const Entry& e : entries_) {
    if (e.q_rows == q_rows && e.kv_rows == kv_rows) return e.result;
  }
  const Problem& p = inputs.problem();
  const int dim = p.dims.head_dim, group = p.dims.group_size(), batch = p.batch;
  const std::int64_t seq = p.seq_len;
  std::int64_t first = seq;
  for (const Range& t : q_rows.tokens) first = std::min(first, t.begin);
  for (const Range& t : kv_rows.tokens) first = std::min(first, t.begin);
  const Range kv_heads{q_rows.heads.begin / group, q_rows.heads.end / group};
  inputs.prepare(TensorId::q, ShardShape{batch, q_rows.heads, {Range{first, seq}}, dim});
  inputs.prepare(TensorId::d_out, ShardShape{batch, q_rows.heads, {Range{first, seq}}, dim});
  inputs.prepare(TensorId::k, ShardShape{batch, kv_heads, {Range{0, seq}}, dim});
  inputs.prepare(TensorId::v, ShardShape{batch, kv_heads, {Range{0, seq}}, dim});

  // Written whole by backward_chunk: dq of every query head, dk and dv of every KV head.
  const auto result = std::make_shared<Result>(Result{
      Shard(ShardShape{q_rows.batch, q_rows.heads, q_rows.tokens, dim}, Uninitialized{}),
      Shard(ShardShape{kv_rows.batch, kv_rows.heads, kv_rows.tokens, dim}, Uninitialized{}),
      Shard(ShardShape{kv_rows.batch, kv_rows.heads, kv_rows.tokens, dim}, Uninitialized{})});
  Result& r = *result;
  // A few KV heads at a time, enough units for every thread: only their forward, dq and key
  // totals are alive at once.
  const std::int64_t per_chunk =
      std::max<std::int64_t>(1, (inputs.pool().size() + group * batch - 1) / (group * batch));
  // Each unit's key totals over [0, S), written whole by the unit (accumulate false).
  std::vector<FloatBuffer> totals;
  for (std::int64_t i = 0; i < 2 * batch * group * std::min(per_chunk, kv_heads.size()); ++i)
    totals.push_back(unwritten_floats(static_cast<std::size_t>(seq) * dim));
  for (std::int64_t g = kv_heads.begin; g < kv_heads.end; g += per_chunk) {
    backward_chunk(inputs, Range{g, std::min(g + per_chunk, kv_heads.end)}, first, q_rows, kv_rows,
                   forward, totals, r);
  }
  const std::size_t bytes =
      (r.dq.data.size() + r.dk.data.size() + r.dv.data.size()) * sizeof(float);
  if (held_bytes_ + bytes <= budget_bytes_) {
    held_bytes_ += bytes;
    entries_.push_back(Entry{q_rows, kv_rows, result});
  }
  return result;
}

std::vector<LocalCp1Backward::Result> shared_cp1_backward(
    const CaseGrid& grid, Transport& transport, const Collectives& collectives, InputStore& inputs,
    LocalCp1Backward& memo, const std::vector<const AttnShard*>& reference) {
  const Problem& p = grid.problem;
  const int dim = p.dims.head_dim, batch = p.batch;
  const std::int64_t group = p.dims.group_size();
  const Range all{0, p.seq_len};
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  if (reference.size() != hosted.size())
    throw std::invalid_argument("shared_cp1_backward: one reference forward per hosted rank");
  // Every row is unpacked from a message: each KV head of the TP group is computed by one CP
  // rank in one round and sent to all of them.
  std::vector<LocalCp1Backward::Result> out;
  for (const LogicalRank& r : hosted) {
    const ShardShape kv{batch, r.kv_heads, r.tokens, dim};
    out.push_back(LocalCp1Backward::Result{Shard(query_shape(grid, r, dim), Uninitialized{}),
                                           Shard(kv, Uninitialized{}), Shard(kv, Uninitialized{})});
  }
  // KV heads a round: enough units (query heads × batch) for the widest process's threads,
  // agreed, since every process must count the same rounds.
  std::uint64_t threads[1] = {static_cast<std::uint64_t>(inputs.pool().size())};
  collectives.max(threads);
  const int per_round = static_cast<int>(
      std::max<std::uint64_t>(1, (threads[0] + group * batch - 1) / (group * batch)));
  // A round at a time: each CP rank's KV heads of the round, computed, shipped and freed.
  for (int round = 0; round < reference_rounds(grid, per_round); ++round) {
    const std::vector<AttnShard> forward =
        gather_round_forward(grid, transport, hosted, reference, round, per_round, inputs.pool());
    std::vector<Message> outgoing;
    ThreadPool& pool = inputs.pool();
    for (std::size_t i = 0; i < hosted.size(); ++i) {
      const LogicalRank& r = hosted[i];
      const Range heads = reference_kv_heads(grid, r, round, per_round);
      if (heads.empty()) continue;
      const std::shared_ptr<const LocalCp1Backward::Result> full = memo.get(
          inputs, ShardShape{batch, Range{heads.begin * group, heads.end * group}, {all}, dim},
          ShardShape{batch, heads, {all}, dim}, &forward[i]);
      const std::size_t first = outgoing.size();
      for (std::int64_t g = heads.begin; g < heads.end; ++g) {
        for (int c = 0; c < grid.spec.cp; ++c) {
          const LogicalRank& dst = grid.at(r.tp_rank, c);
          for (const Range& t : dst.tokens) {
            const MessageHeader h = reference_grads_header(grid, r, dst, t, g);
            outgoing.push_back(Message{h, unwritten_floats(static_cast<std::size_t>(h.floats))});
          }
        }
      }
      // Packed a message a task (each writes its own payload), before the next rank's result.
      pool.parallel_for(static_cast<std::int64_t>(outgoing.size() - first), [&](std::int64_t k) {
        Message& m = outgoing[first + static_cast<std::size_t>(k)];
        pack_reference(*full, m.header.head_begin, group, m.header.tokens(), m.payload.data());
      });
    }
    std::map<int, Inbox> inboxes =
        protocol::superstep(transport, hosted, std::move(outgoing), [&](const LogicalRank& dst) {
          return expected_reference_grads(grid, dst, round, per_round);
        });
    // Unpacked a message a task: each writes its own rows.
    std::vector<std::pair<const Message*, LocalCp1Backward::Result*>> unpack;
    for (std::size_t i = 0; i < hosted.size(); ++i) {
      for (const Message& m : inboxes.at(hosted[i].id).messages()) unpack.emplace_back(&m, &out[i]);
    }
    pool.parallel_for(static_cast<std::int64_t>(unpack.size()), [&](std::int64_t k) {
      unpack_reference(*unpack[static_cast<std::size_t>(k)].first, group,
                       *unpack[static_cast<std::size_t>(k)].second);
    });
  }
  return out;
}

}  // namespace cpd
