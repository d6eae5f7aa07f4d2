// The canonical merge of partial attention states (design §3): the states of one query range
// against the KV blocks of the global block grid, each tagged with its block's global index,
// folded left in ascending block index with merge_state_row (attention_math.h), ties in the
// order given. Whatever the topology that produced the states and the order they arrived in,
// the bits are the same.
//
// Host and device (fold_rows_in_order); merge_in_block_order sorts on the host. Build with
// `pkg-config --cflags cpdrift` (-ffp-contract=off) and, under nvcc, --fmad=false
// (`pkg-config --variable=nvcc_flags cpdrift`): the bits depend on no a*b+c being fused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpdrift/attention_math.h"

namespace cpd {

/// The partial state of `rows` query rows against one KV block: out [rows][dim], lse [rows]
/// (lse = -inf and out = 0 where a row sees none of the block).
struct BlockState {
  int block_index = 0;  // the block's index in the global block grid
  const float* out = nullptr;
  const float* lse = nullptr;
};

/// Row `row` of the fold of `n` states that are already in ascending block index:
/// out/lse ← s_0 ⊕ s_1 ⊕ … from the identity (out 0, lse -inf). `out` needs `dim` floats.
CPD_HD void fold_row_in_order(const BlockState* sorted, int n, std::int64_t row, int dim,
                              float* out, float* lse) {
  for (int d = 0; d < dim; ++d) out[d] = 0.0f;
  *lse = neg_inf_f32();
  for (int i = 0; i < n; ++i) {
    merge_state_row(out, lse, sorted[i].out + row * dim, sorted[i].lse[row], dim);
  }
}

#if !defined(__CUDA_ARCH__)
/// Merges `n` states given in any order into out [rows][dim] and lse [rows]: sorted by block
/// index (stable, so ties keep the order given), then each row folded. Host only.
inline void merge_in_block_order(const BlockState* states, std::size_t n, std::int64_t rows,
                                 int dim, float* out, float* lse) {
  // An insertion sort, stable and linear on states that come in or near block order, into a
  // buffer each thread keeps.
  thread_local std::vector<BlockState> sorted;
  sorted.assign(states, states + n);
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    const BlockState moving = sorted[i];
    std::size_t j = i;
    for (; j > 0 && moving.block_index < sorted[j - 1].block_index; --j) sorted[j] = sorted[j - 1];
    sorted[j] = moving;
  }
  // A row at a time through every state: the row stays in the cache while its states stream by.
  for (std::int64_t r = 0; r < rows; ++r) {
    fold_row_in_order(sorted.data(), static_cast<int>(n), r, dim, out + r * dim, lse + r);
  }
}

/// The same over a contiguous container of states (a std::vector, a std::span).
template <class Contiguous>
void merge_in_block_order(const Contiguous& states, std::int64_t rows, int dim, float* out,
                          float* lse) {
  merge_in_block_order(states.data(), states.size(), rows, dim, out, lse);
}
#endif

}  // namespace cpd
