// A distributed tensor as the pieces the processes hold, in global [B, H, S, W] order: what
// digests, dumps and gathers stream to rank 0 one piece at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/collectives.h"
#include "core/range.h"

namespace cpd {

/// One (batch, head, token range) row block of a global tensor.
struct GlobalPiece {
  int b = 0;
  std::int64_t h = 0;
  Range tokens;
  int owner = 0;  // process
};

/// A global [batch, heads, seq_len, width] tensor (width 1: [B, H, S]) as pieces in global
/// order; every process holds the same piece list and the data of the pieces it owns.
struct GlobalTensor {
  int batch = 1;
  std::int64_t heads = 0;
  std::int64_t seq_len = 0;
  int width = 1;
  std::vector<GlobalPiece> pieces;      // global order
  std::vector<StreamSegment> segments;  // same order; data set where hosted here

  /// Appends the next piece in global order, with its rows' `data` where this process holds it
  /// (else null).
  void add(const GlobalPiece& piece, const float* data) {
    pieces.push_back(piece);
    segments.push_back(
        StreamSegment{piece.owner, data, static_cast<std::size_t>(piece.tokens.size() * width)});
  }
};

/// Called on rank 0 for every piece in global order with its rows ([tokens][width]).
using PieceSink = std::function<void(const GlobalPiece&, const float* rows)>;

}  // namespace cpd
