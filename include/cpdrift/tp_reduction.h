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

// vLLM's custom all-reduce (read at vllm-project/vllm 036bb685581dbedcd6cf7fc845fe87268c7d1191,
// csrc/custom_all_reduce.cuh): every rank reads the others' buffers over NVLink and sums a packed
// element (16 bytes: 8 BF16 values) upcast to FP32, rounding once to the dtype at the end.
// `CustomAllreduce::allreduce` runs one stage for 2 ranks, and with full NVLink for ≤ 4 ranks
// under 512 KiB or ≤ 8 ranks under 256 KiB; two stages otherwise with full NVLink (the half
// butterfly without it, not emulated).

/// The stages vLLM's custom all-reduce takes for `bytes` over `ranks` fully NVLink-connected
/// ranks: 1 (cross_device_reduce_1stage) or 2 (cross_device_reduce_2stage).
CPD_HD int vllm_custom_allreduce_stages(int ranks, std::int64_t bytes) {
  if (ranks == 2) return 1;
  return (ranks <= 4 && bytes < 512 * 1024) || (ranks <= 8 && bytes < 256 * 1024) ? 1 : 2;
}

/// One stage: ranks 0, 1, …, n − 1 in that order on every rank ("we don't reorder the address
/// so the accumulation order is the same for all ranks"), in FP32, then one rounding.
CPD_HD float vllm_one_stage_sum(const float* by_rank, int ranks, WireType dtype) {
  float sum = by_rank[0];
  for (int r = 1; r < ranks; ++r) sum = sum + by_rank[r];
  return to_wire(sum, dtype);
}

/// Two stages: the buffer's packs (`pack_elems` elements each, 8 for BF16) cut into `ranks`
/// parts of ⌊packs / ranks⌋ packs, the last part taking the rest; element `i`'s part owner.
CPD_HD int vllm_two_stage_owner(std::int64_t i, std::int64_t count, int ranks, int pack_elems = 8) {
  const std::int64_t part = count / pack_elems / ranks;
  const std::int64_t owner = part == 0 ? ranks - 1 : (i / pack_elems) / part;
  return static_cast<int>(owner < ranks - 1 ? owner : ranks - 1);
}

/// The owner's reduce-scatter sum of its part: ranks owner, owner + 1, … (mod n), in FP32,
/// then one rounding; the all-gather copies it.
CPD_HD float vllm_two_stage_sum(const float* by_rank, int ranks, int owner, WireType dtype) {
  float sum = by_rank[owner];
  for (int k = 1; k < ranks; ++k) sum = sum + by_rank[(owner + k) % ranks];
  return to_wire(sum, dtype);
}

}  // namespace cpd
