// The tensor-parallel reductions of the production stacks (the production-reduction lanes,
// docs/numerics.md §12), emulated element by element in cpdrift's arithmetic: the order in which
// NCCL's ring all-reduce (and reduce-scatter) sums the ranks' partials of one element, and the
// precision of every hop. The canonical grid folds head groups in ascending order in FP32 along
// the TP chain (engine/o_proj.h); these do not.
//
// Read at NVIDIA/nccl 0e35f5d3902f4e30c4c97b9700a6a64b25ba7f7f, src/device/all_reduce.h,
// runRing: on ring position p, step 0 sends chunk (p + n − 1) mod n; steps j = 2 … n − 1 receive
// chunk (p + n − j) mod n, add their own and send it on; step n − 1 receives chunk p, adds its own
// and holds the reduced chunk (then the all-gather half copies it around unchanged). So chunk c
// is started by position c + 1 and ends reduced on position c, every partial sum travelling in
// the collective's data type: a BF16 all-reduce rounds after every addition.
#pragma once

#include <cstdint>

#include "cpdrift/bf16.h"
#include "cpdrift/hd.h"

namespace cpd {

/// The data type on the wire of a ring: every partial sum is rounded to it.
enum class WireType : std::uint8_t { bf16, fp32 };

CPD_HD float to_wire(float x, WireType wire) { return wire == WireType::bf16 ? round_bf16(x) : x; }

/// The ring all-reduce's sum of one element of ring chunk `chunk` over `ranks` ring positions,
/// `by_position[p]` the value position p holds (already in the wire type when the caller's
/// buffer is): wire(…wire(wire(x[c+1] + x[c+2]) + x[c+3]) … + x[c]), indices mod ranks. The
/// chain's start is `start_offset` positions after the chunk (1 for NCCL; another value is the
/// control of a different ring). One rank: the value itself, on the wire.
CPD_HD float ring_chunk_sum(const float* by_position, int ranks, int chunk, WireType wire,
                            int start_offset = 1) {
  const int first = (chunk + start_offset) % ranks;
  float sum = to_wire(by_position[first], wire);
  for (int k = 1; k < ranks; ++k) {
    const float x = to_wire(by_position[(first + k) % ranks], wire);
    sum = to_wire(sum + x, wire);
  }
  return sum;
}

/// Which ring chunk element `i` falls in, for a single-channel ring whose chunks hold
/// `chunk_elems` elements: the buffer runs in loops of ranks · chunk_elems elements, chunk c of a
/// loop at [c · chunk_elems, (c + 1) · chunk_elems) of it. NCCL sizes a loop's chunks from its
/// protocol, thread count and what is left of the buffer (runRing's realChunkSize, rounded up to
/// its granule), so this is exact for a buffer of one loop, or of whole loops; the lanes take
/// chunk_elems as a parameter and say which they assume.
CPD_HD int ring_chunk_of(std::int64_t i, int ranks, std::int64_t chunk_elems) {
  return static_cast<int>((i / chunk_elems) % ranks);
}

}  // namespace cpd
