#include "engine/layer_logprobs.h"

#include <cstring>
#include <map>

#include "engine/protocol_common.h"
#include "kernels/attention_backend.h"

namespace cpd {
namespace {

// The logits of the chunk's rows `x` ([2][B][rows][hidden]) over vocabulary `range`:
// [2][B][rows][range], each one chain over the hidden dim (the projection tile's).
FloatBuffer range_logits(const Problem& p, const float* x, std::int64_t rows, const Range& range,
                         InputStore& store) {
  const int hidden = p.dims.hidden_size;
  const auto width = static_cast<int>(range.size());
  FloatBuffer z = unwritten_floats(static_cast<std::size_t>(2 * p.batch * rows * width));
  if (width == 0) return z;
  const std::vector<float>& w = store.layer_lm_head(range);
  std::vector<ProjectionJob> jobs;
  for (int plane = 0; plane < 2 * p.batch; ++plane) {
    jobs.push_back(ProjectionJob{x + plane * rows * hidden, rows, w.data(), hidden,
                                 z.data() + plane * rows * width});
  }
  store.backend().project_heads(jobs, hidden, width);
  return z;
}

// A range's logits into their places of the whole rows ([2][B][rows][vocab]); an empty range
// (a TP rank holding no block) has none.
void place(const FloatBuffer& z, const Range& range, std::int64_t planes_rows, int vocab,
           float* rows) {
  const std::int64_t width = range.size();
  for (std::int64_t r = 0; r < planes_rows && width > 0; ++r) {
    std::memcpy(rows + r * vocab + range.begin, z.data() + r * width,
                static_cast<std::size_t>(width) * sizeof(float));
  }
}

}  // namespace

std::vector<TokenLogprobs> run_layer_dlogp(const CaseGrid& grid,
                                           const std::vector<LayerOutputs>& layer, int vocab,
                                           Transport& transport, InputStore& store) {
  const Problem& p = grid.problem;
  const int tp = grid.spec.tp, hidden = p.dims.hidden_size;
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  const TpChain chain = layer_logit_chain(grid, vocab);
  std::map<int, const LayerOutputs*> own;  // owner id -> its layer output
  std::vector<TokenLogprobs> result;
  std::map<int, std::size_t> owned;  // owner id -> its result
  for (const LayerOutputs& o : layer) own[o.rank.id] = &o;
  for (const LogicalRank& r : hosted) {
    if (r.tp_rank != 0) continue;
    const ShardShape shape{p.batch, Range{0, 1}, r.tokens, 1};
    owned[r.id] = result.size();
    result.push_back(TokenLogprobs{r, Shard(shape), Shard(shape), Shard(shape)});
  }
  std::vector<std::vector<Range>> chunks;  // per CP rank: its owner's chunks, for every TP rank
  for (int c = 0; c < grid.spec.cp; ++c) chunks.push_back(chain_chunks(chain, grid.at(0, c)));
  const auto expected = [&](int step) {
    return [&grid, vocab, step](const LogicalRank& r) {
      return expected_layer_logits(grid, r, vocab, step);
    };
  };
  for (int step = 0; step < layer_dlogp_steps(grid, vocab); step += 2) {
    // The owners' chunk rows, [2][B][rows][hidden], by owner id; sent to the other TP ranks.
    std::map<int, FloatBuffer> rows_of;
    std::vector<Message> outgoing;
    for (const LogicalRank& r : hosted) {
      const std::vector<Range>& mine = chunks[static_cast<std::size_t>(r.cp_rank)];
      if (r.tp_rank != 0 || step / 2 >= static_cast<int>(mine.size())) continue;
      const Range& tokens = mine[static_cast<std::size_t>(step / 2)];
      const LayerOutputs& o = *own.at(r.id);
      const std::int64_t n = tokens.size() * hidden,
                         first = o.candidate.shape.local_row(tokens.begin);
      FloatBuffer x = unwritten_floats(static_cast<std::size_t>(2 * p.batch * n));
      for (int which = 0; which < 2; ++which) {
        const Shard& s = which == 0 ? o.candidate : o.reference;
        for (int b = 0; b < p.batch; ++b) {
          std::memcpy(x.data() + (which * p.batch + b) * n, s.at(b, 0, first),
                      static_cast<std::size_t>(n) * sizeof(float));
        }
      }
      for (int t = 1; t < tp; ++t) {
        for (const MessageHeader& h :
             expected_layer_logits(grid, grid.at(t, r.cp_rank), vocab, step))
          outgoing.push_back(Message{h, x});
      }
      rows_of[r.id] = std::move(x);
    }
    std::map<int, Inbox> arrived =
        protocol::superstep(transport, hosted, std::move(outgoing), expected(step));
    // Each rank's range of the chunk's logits; the others' go to their owner.
    std::map<int, FloatBuffer> whole;  // owner id -> the chunk's whole rows [2][B][rows][V]
    outgoing.clear();
    for (const LogicalRank& r : hosted) {
      const std::vector<Range>& mine = chunks[static_cast<std::size_t>(r.cp_rank)];
      if (step / 2 >= static_cast<int>(mine.size())) continue;
      const std::int64_t rows = mine[static_cast<std::size_t>(step / 2)].size();
      const Range range = vocab_shard(vocab, tp, r.tp_rank);
      if (r.tp_rank == 0) {
        FloatBuffer& all = whole[r.id];
        all = unwritten_floats(static_cast<std::size_t>(2 * p.batch * rows * vocab));
        place(range_logits(p, rows_of.at(r.id).data(), rows, range, store), range,
              2 * p.batch * rows, vocab, all.data());
        continue;
      }
      const Message m = std::move(arrived.at(r.id).take_messages().at(0));
      FloatBuffer z = range_logits(p, m.payload.data(), rows, range, store);
      for (const MessageHeader& h :
           expected_layer_logits(grid, grid.at(0, r.cp_rank), vocab, step + 1)) {
        if (h.src == r.id) outgoing.push_back(Message{h, std::move(z)});
      }
    }
    arrived = protocol::superstep(transport, hosted, std::move(outgoing), expected(step + 1));
    for (auto& [id, all] : whole) {
      const LogicalRank& r = grid.ranks[static_cast<std::size_t>(id)];
      const Range& tokens =
          chunks[static_cast<std::size_t>(r.cp_rank)][static_cast<std::size_t>(step / 2)];
      for (const Message& m : arrived.at(id).take_messages()) {
        place(m.payload, m.header.heads(), 2 * p.batch * tokens.size(), vocab, all.data());
      }
      chunk_logprobs(p, tokens, all.data(), vocab, result[owned.at(id)], store.pool());
    }
  }
  return result;
}

}  // namespace cpd
