#include "engine/rollout_pairs.h"

#include <algorithm>
#include <functional>

#include "cpdrift/logprob_math.h"
#include "engine/protocol.h"
#include "engine/run_context.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/inputs.h"
#include "kernels/cpu/logprob_rows.h"
#include "kernels/layer_weights.h"

namespace cpd {
namespace {

// Where row (b, h, i) of the decoded positions lives: its process and, on that process, its
// out (D floats) and lse.
struct RowSource {
  int process = 0;
  const float* out = nullptr;
  const float* lse = nullptr;
};

// Streams every decoded row, (b, h, i) order, to rank 0 into rows.out and rows.lse.
void stream_decoded(const RunContext& ctx, const PagedWorkload& w,
                    const std::function<RowSource(int, int, std::int64_t)>& where,
                    DecodedRows& rows) {
  const Problem& p = ctx.problem;
  const int hq = p.dims.num_q_heads, dim = p.dims.head_dim;
  const std::size_t n = static_cast<std::size_t>(p.batch) * hq * w.q_len;
  std::vector<StreamSegment> segments;
  segments.reserve(2 * n);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < hq; ++h) {
      for (std::int64_t i = 0; i < w.q_len; ++i) {
        const RowSource s = where(b, h, i);
        segments.push_back(StreamSegment{s.process, s.out, static_cast<std::size_t>(dim)});
        segments.push_back(StreamSegment{s.process, s.lse, 1});
      }
    }
  }
  const bool root = ctx.collectives.root();
  rows.out.assign(root ? n * dim : 0, 0.0f);
  rows.lse.assign(root ? n : 0, 0.0f);
  ctx.collectives.stream_to_root(segments, [&](std::size_t k, const float* data) {
    const std::size_t row = k / 2;
    if (k % 2 == 0) {
      std::copy_n(data, dim, rows.out.begin() + static_cast<std::ptrdiff_t>(row * dim));
    } else {
      rows.lse[row] = *data;
    }
  });
}

// Block starts at or before `pos`.
std::vector<std::int64_t> starts_through(const std::vector<Range>& blocks, std::int64_t pos) {
  std::vector<std::int64_t> s;
  for (const Range& b : blocks) {
    if (b.begin <= pos) s.push_back(b.begin);
  }
  return s;
}

// Rank 0, --scope layer: the layer's output of every decoded token of `rows` (rows.layer), every
// head group's o_proj partial folded in ascending group order by the projection tile (the bits
// of the TP chain, engine/o_proj.cpp): the one-rank sum of tp_lane_layer, written in the run's
// dtype.
void add_layer(const Problem& p, const PagedWorkload& w, InputStore& store, DecodedRows& rows) {
  const TpCollective one{1, {}, [](int, std::int64_t) { return CollectiveRow{}; }};
  rows.layer = tp_lane_layer(p, store, rows.out, w.q_len, one, TpLane::megatron_ar);
}

// Rank 0: the target token's logprob of every decoded token from its logits ([B][q_len][V]).
std::vector<float> target_logprobs(const Problem& p, const PagedWorkload& w, int vocab,
                                   const std::vector<float>& logits) {
  std::vector<float> logprob;
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t i = 0; i < w.q_len; ++i) {
      const float* row = logits.data() + (static_cast<std::size_t>(b) * w.q_len + i) * vocab;
      const std::int64_t pos = w.queries(b).begin + i;
      logprob.push_back(log_softmax_at_lanes(row, vocab, logprob_target(b, pos, p.seq_len, vocab)));
    }
  }
  return logprob;
}

// Rank 0: the logits of a layer output of the decoded tokens ([B][q_len][hidden]) through the
// layer's lm_head, [B][q_len][V].
std::vector<float> layer_logits(const Problem& p, const PagedWorkload& w, int vocab,
                                InputStore& store, const std::vector<float>& layer) {
  std::vector<float> logits(static_cast<std::size_t>(p.batch * w.q_len) * vocab);
  const std::vector<float>& lm = store.layer_lm_head(Range{0, vocab});
  const ProjectionJob job{layer.data(), p.batch * w.q_len, lm.data(), p.dims.hidden_size,
                          logits.data()};
  store.backend().project_heads({&job, 1}, p.dims.hidden_size, vocab);
  return logits;
}

// Rank 0: the logits and the target token's logprob of every decoded token of `rows`, through
// the run's lm_head of `vocab` (the input store's, each head's columns generated once per run;
// the layer's, over the layer's output, under --scope layer — and over each of `tp`'s lanes).
void add_logits(const Problem& p, const PagedWorkload& w, int vocab, InputStore& store,
                const TpCollective* tp, DecodedRows& rows) {
  const int hq = p.dims.num_q_heads, dim = p.dims.head_dim;
  const std::size_t plane = static_cast<std::size_t>(w.q_len) * vocab;
  if (p.layer) {
    add_layer(p, w, store, rows);
    rows.logits = layer_logits(p, w, vocab, store, rows.layer);
    for (const TpLane lane : tp != nullptr ? tp->lanes : std::vector<TpLane>{}) {
      DecodedRows::TpLaneRows& l = rows.tp_lanes.emplace_back();
      l.lane = lane;
      l.layer = tp_lane_layer(p, store, rows.out, w.q_len, *tp, lane);
      l.logits = layer_logits(p, w, vocab, store, l.layer);
      l.logprob = target_logprobs(p, w, vocab, l.logits);
    }
  } else {
    rows.logits.resize(static_cast<std::size_t>(p.batch) * plane);  // [B][q_len][V]
    std::vector<FoldedProjectionJob> jobs;
    for (int b = 0; b < p.batch; ++b) {
      jobs.push_back(FoldedProjectionJob{{}, rows.logits.data() + b * plane});
      for (int h = 0; h < hq; ++h) {
        const std::size_t bh = static_cast<std::size_t>(b) * hq + h;
        jobs.back().heads.push_back(ProjectionJob{rows.out.data() + bh * w.q_len * dim, w.q_len,
                                                  store.lm_head(vocab, h).data(), dim, nullptr});
      }
    }
    store.backend().project_folded(jobs, dim, vocab);
  }
  rows.logprob = target_logprobs(p, w, vocab, rows.logits);
}

}  // namespace

DecodedRows gather_trainer_rows(const RunContext& ctx, const CaseGrid& grid,
                                const std::string& name,
                                const std::vector<const AttnShard*>& written,
                                const PagedWorkload& w, bool tp_lanes) {
  const Problem& p = ctx.problem;
  const int world = ctx.transport.world_size();
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, ctx.transport);
  DecodedRows rows;
  rows.case_name = name;
  const std::vector<Range> blocks = kv_block_bounds(grid.spec, p.seq_len);
  rows.blocks.assign(static_cast<std::size_t>(p.batch), blocks);
  for (int c = 0; c < grid.spec.cp; ++c) rows.cp_shards.push_back(grid.at(0, c).tokens);
  const int heads_per_tp = p.dims.num_q_heads / grid.spec.tp;
  stream_decoded(
      ctx, w,
      [&](int b, int h, std::int64_t i) {
        const std::int64_t pos = w.queries(b).begin + i;
        const int t = h / heads_per_tp;
        int c = 0;
        while (c + 1 < grid.spec.cp &&
               std::none_of(grid.at(t, c).tokens.begin(), grid.at(t, c).tokens.end(),
                            [&](const Range& r) { return r.contains(pos); })) {
          ++c;
        }
        const LogicalRank& owner = grid.at(t, c);
        RowSource s{process_of(owner.id, world)};
        for (std::size_t k = 0; k < hosted.size(); ++k) {
          if (hosted[k].id != owner.id) continue;
          const AttnShard& a = *written[k];
          const std::int64_t row = a.out.shape.local_row(pos);
          s.out = a.out.at(b, h, row);
          s.lse = a.lse.at(b, h, row);
        }
        return s;
      },
      rows);
  if (!ctx.collectives.root()) return rows;
  // Megatron's buffer: the CP rank's tokens, [S_cp][B][hidden] (sequence-major).
  TpCollective tp{
      grid.spec.tp, {kTrainerTpLanes.begin(), kTrainerTpLanes.end()}, [&](int b, std::int64_t i) {
        const std::int64_t pos = w.queries(b).begin + i;
        for (const std::vector<Range>& shard : rows.cp_shards) {
          const ShardShape s{p.batch, Range{0, 1}, shard, 1};
          if (s.local_row(pos) >= 0)
            return CollectiveRow{s.local_row(pos) * p.batch + b, s.rows() * p.batch};
        }
        return CollectiveRow{};
      }};
  add_logits(ctx.problem, w, ctx.decoded->vocab_size, ctx.inputs,
             tp_lanes && p.reduction_lanes ? &tp : nullptr, rows);
  return rows;
}

DecodedRows gather_rollout_rows(const RunContext& ctx, const PagedWorkload& w,
                                const std::string& name, bool auto_split,
                                const std::vector<std::vector<Range>>& plans,
                                const std::vector<int>& head_owner, const AttnShard* lane,
                                int vocab, const TpCollective* tp) {
  DecodedRows rows;
  rows.case_name = name;
  rows.rollout = true;
  rows.auto_split = auto_split;
  rows.blocks = plans;
  stream_decoded(
      ctx, w,
      [&](int b, int h, std::int64_t i) {
        RowSource s{head_owner[static_cast<std::size_t>(h)]};
        if (lane != nullptr && lane->out.shape.heads.contains(h)) {
          s.out = lane->out.at(b, h, i);
          s.lse = lane->lse.at(b, h, i);
        }
        return s;
      },
      rows);
  if (ctx.collectives.root())
    add_logits(ctx.problem, w, vocab, ctx.inputs, ctx.problem.reduction_lanes ? tp : nullptr, rows);
  return rows;
}

bool aligned(const DecodedRows& trainer, const DecodedRows& rollout, const PagedWorkload& w) {
  for (int b = 0; b < w.sequences(); ++b) {
    const std::vector<Range>& t = trainer.blocks[static_cast<std::size_t>(b)];
    const std::vector<Range>& r = rollout.blocks[static_cast<std::size_t>(b)];
    for (std::int64_t pos = w.queries(b).begin; pos < w.queries(b).end; ++pos) {
      if (starts_through(t, pos) != starts_through(r, pos)) return false;
    }
  }
  return true;
}

}  // namespace cpd
