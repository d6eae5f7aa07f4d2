// A case's global tensors as the pieces its logical ranks hold, streamed to rank 0 in global
// [B, H, S, W] order for digests and dumps: rank 0 holds one piece at a time.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cpdrift/core/shard.h"
#include "cpdrift/engine/collectives.h"
#include "cpdrift/engine/manifest.h"
#include "cpdrift/metrics/digest.h"

namespace cpd {

/// One (batch, head, token range) row block of a global tensor.
struct GlobalPiece {
  int b = 0;
  std::int64_t h = 0;
  Range tokens;
  int owner = 0;  // process
};

/// The global tensor made of the logical ranks' query-shaped shards of width `width`
/// (head_dim for out, 1 for lse). `hosted` are this process's shards, in the order of
/// hosted_ranks(); every process builds the same piece list.
struct GlobalTensor {
  int batch = 1;
  std::int64_t heads = 0;
  std::int64_t seq_len = 0;
  int width = 1;
  std::vector<GlobalPiece> pieces;      // global order
  std::vector<StreamSegment> segments;  // same order; data set where hosted here
};

/// Whose heads a tensor's shards are laid out over; `token` is a per-token tensor ([B, 1, S]:
/// one value per token, held by the TP rank 0 of each CP rank; `hosted` lists only those).
enum class HeadKind { query, kv, token };

GlobalTensor global_tensor(const CaseGrid& grid, int world_size, int process, int width,
                           const std::vector<const Shard*>& hosted,
                           HeadKind heads = HeadKind::query);

/// Called on rank 0 for every piece in global order with its rows ([tokens][width]).
using PieceSink = std::function<void(const GlobalPiece&, const float* rows)>;

/// Streams the tensor to rank 0 (collective) and returns its SHA-256 in `format` there
/// ("" elsewhere). `also` sees every piece on rank 0 too (the dump writer), when set.
std::string stream_digest(const Collectives& coll, const GlobalTensor& tensor, DigestFormat format,
                          const PieceSink& also = {});

}  // namespace cpd
