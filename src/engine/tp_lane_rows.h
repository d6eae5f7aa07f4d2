// The TP-reduction lanes (numerics.md §12) of the decoded tokens' layer output, on rank 0: the
// trainer-vs-rollout pairs and the paged cases read the layer's output at the decoded positions
// only, so each side's stack is emulated there, from the attention rows gathered to rank 0.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/model.h"
#include "cpdrift/tp_lanes.h"
#include "kernels/input_store.h"

namespace cpd {

/// Where a token's row sits in the buffer its stack's TP collective reduces: the row's index
/// and the buffer's rows (each `hidden` elements; the buffer one rank of the collective holds).
struct CollectiveRow {
  std::int64_t row = 0, rows = 1;
};

/// A side's TP collective over the decoded tokens: its ranks (the side's TP size), the lanes
/// it emulates and where token i of sequence b sits in its buffer.
struct TpCollective {
  int ranks = 1;
  std::vector<TpLane> lanes;
  std::function<CollectiveRow(int b, std::int64_t i)> row_of;
};

/// The layer's output of the decoded tokens under `lane`, [B][q][hidden]: each TP rank's head
/// groups folded in ascending order (its GEMM, the projection tile's bits), then the lane's sum of
/// the ranks' partials, element by element. `out`: the attention rows, [B][Hq][q][D]. One rank:
/// the canonical layer output (every lane writes its one partial in the dtype).
std::vector<float> tp_lane_layer(const Problem& p, InputStore& store, const std::vector<float>& out,
                                 std::int64_t q, const TpCollective& tp, TpLane lane);

}  // namespace cpd
