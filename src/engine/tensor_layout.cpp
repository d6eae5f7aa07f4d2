#include "engine/tensor_layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/protocol.h"

namespace cpd {

GlobalTensor global_tensor(const CaseGrid& grid, int world_size, int process, int width,
                           const std::vector<const Shard*>& hosted, HeadKind heads) {
  const bool kv = heads == HeadKind::kv, per_token = heads == HeadKind::token;
  GlobalTensor t{grid.problem.batch,
                 per_token ? 1
                 : kv      ? grid.problem.dims.num_kv_heads
                           : grid.problem.dims.num_q_heads,
                 grid.problem.seq_len,
                 width,
                 {},
                 {}};
  struct Entry {
    GlobalPiece piece;
    const float* data;
  };
  std::vector<Entry> entries;
  std::size_t next_hosted = 0;
  for (const LogicalRank& r : grid.ranks) {
    if (per_token && r.tp_rank != 0) continue;  // a token's value lives on TP rank 0 alone
    const int owner = process_of(r.id, world_size);
    const Shard* shard = owner == process ? hosted.at(next_hosted++) : nullptr;
    for (int b = 0; b < t.batch; ++b) {
      const Range owned = per_token ? Range{0, 1} : kv ? r.kv_heads : r.q_heads;
      for (std::int64_t h = owned.begin; h < owned.end; ++h) {
        for (const Range& tokens : r.tokens) {
          const float* data =
              shard ? shard->at(b, h, shard->shape.local_row(tokens.begin)) : nullptr;
          entries.push_back(Entry{GlobalPiece{b, h, tokens, owner}, data});
        }
      }
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) {
    return std::tie(x.piece.b, x.piece.h, x.piece.tokens.begin) <
           std::tie(y.piece.b, y.piece.h, y.piece.tokens.begin);
  });
  // The shards must tile the tensor: per (b, h), token ranges from 0 to S with no gap or overlap.
  std::int64_t expect = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const GlobalPiece& p = entries[i].piece;
    if (p.tokens.begin != expect) {
      throw std::logic_error("global_tensor: the shards do not tile (b " + std::to_string(p.b) +
                             ", h " + std::to_string(p.h) + ") at token " + std::to_string(expect));
    }
    const bool last =
        i + 1 == entries.size() || entries[i + 1].piece.b != p.b || entries[i + 1].piece.h != p.h;
    expect = last ? 0 : p.tokens.end;
    if (last && p.tokens.end != t.seq_len) {
      throw std::logic_error("global_tensor: the shards of (b " + std::to_string(p.b) + ", h " +
                             std::to_string(p.h) + ") end at " + std::to_string(p.tokens.end));
    }
  }
  for (const Entry& e : entries) t.add(e.piece, e.data);
  return t;
}

CaseTensor case_tensor(const CaseGrid& grid, const Transport& transport, std::string path,
                       const std::vector<const Shard*>& hosted, int width, HeadKind heads,
                       bool bf16, bool digest) {
  const bool per_token = heads == HeadKind::token;
  CaseTensor t;
  t.path = std::move(path);
  t.digest = digest;
  t.bf16 = bf16;
  t.layout =
      global_tensor(grid, transport.world_size(), transport.process_index(), width, hosted, heads);
  t.attributes = {{"shape", per_token   ? (width > 1 ? "[B, 1, S, hidden]" : "[B, 1, S]")
                            : width > 1 ? "[B, H, S, D]"
                                        : "[B, H, S]"},
                  {"heads", per_token               ? "none (one value per token)"
                            : heads == HeadKind::kv ? "kv"
                                                    : "query"}};
  return t;
}

}  // namespace cpd
