// The CPU backend's attention backward: bit for bit the canonical block-pair arithmetic of
// cpdrift/attention_backward_math.h, tiled 16 query rows at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/attention_jobs.h"
#include "core/util/thread_pool.h"
#include "kernels/cpu/attention.h"

namespace cpd {

/// Query rows of one backward tile: sixteen lane tiles, so that each pass over a KV block's K,
/// V, dK and dV serves 256 rows (at S = 32768 a head's K, V, dK and dV are 64 MB, which stream
/// from memory once per tile; its scratch, 640 KB, stays in L2).
inline constexpr int kBackwardRows = 16 * kTileRows;

struct BackwardScratch {
  std::vector<float> q_t, d_out_t;  // per lane tile [dim][16]
  std::vector<float> p, ds, dp;     // per lane tile [a chunk of keys][16]
  FloatBuffer dk, dv;               // [keys][dim]: one query block's partials (huge pages)
};

/// One query tile (rows ≤ kBackwardRows consecutive positions first_pos …, of one head) against
/// every key of one KV block (`keys`; k, v [keys.size()][dim]):
///   dq [rows][dim]             ← the rows' partial dq over this block (overwritten)
///   dk, dv [keys.size()][dim]  += the rows' contributions, in row order
/// q, d_out [rows][dim]; lse (merged forward), delta [rows]. dim: a multiple of 64.
void backward_tile(const float* q, const float* d_out, const float* lse, const float* delta,
                   std::int64_t first_pos, int rows, const float* k, const float* v, Range keys,
                   int dim, float scale, BackwardScratch& scratch, float* dq, float* dk, float* dv);

void run_backward_units(std::span<const BackwardUnit> units, int dim, float scale,
                        ThreadPool& pool);

/// out ← first term, then out = out + term for each further term (the canonical fold of
/// partial sums over blocks or heads), element-wise over `n` floats: elements [offset,
/// offset + n) of each term into out[0, n).
void fold_terms(std::span<const float* const> terms, std::size_t n, float* out,
                std::size_t offset = 0);

}  // namespace cpd
