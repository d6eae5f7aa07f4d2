// The production stacks' sums over tensor-parallel ranks (the TP-reduction lanes, numerics.md
// §12): where the canonical grid folds the layer's head groups in ascending order in FP32 along
// the TP chain, a stack's row-parallel linear writes each TP rank's partial in the model's dtype
// and sums the partials with a collective. Each lane is one stack's collective, element by
// element, on cpdrift's arithmetic (tp_reduction.h); the upstream it reproduces is named in
// kTpLaneInfo and in the report.
#pragma once

#include <array>
#include <cstdint>

#include "cpdrift/enum_names.h"
#include "cpdrift/tp_reduction.h"

namespace cpd {

enum class TpLane : std::uint8_t {
  megatron_ar,  // Megatron-Core RowParallelLinear: NCCL ring all-reduce over TP
  megatron_sp,  // the same with sequence parallelism: NCCL ring reduce-scatter over sequence
  vllm_ar,      // vLLM's TP all-reduce: custom all-reduce below its size limit, else NCCL
  vllm_bi,      // vLLM's batch-invariant mode: NCCL tree, one channel, no custom all-reduce
  // The weight gradients' sum over DP × CP (Megatron's distributed optimizer): NCCL ring
  // reduce-scatter of each rank's partial, FP32 (grad_reduce_in_fp32) or BF16 gradients.
  megatron_grad_fp32,
  megatron_grad_bf16,
};

inline constexpr std::array<TpLane, 2> kTrainerTpLanes{TpLane::megatron_ar, TpLane::megatron_sp};
inline constexpr std::array<TpLane, 2> kRolloutTpLanes{TpLane::vllm_ar, TpLane::vllm_bi};
inline constexpr std::array<TpLane, 2> kGradientLanes{TpLane::megatron_grad_fp32,
                                                      TpLane::megatron_grad_bf16};

inline constexpr EnumName<TpLane> kTpLaneNames[] = {
    {TpLane::megatron_ar, "megatron_ar"},
    {TpLane::megatron_sp, "megatron_sp"},
    {TpLane::vllm_ar, "vllm_ar"},
    {TpLane::vllm_bi, "vllm_bi"},
    {TpLane::megatron_grad_fp32, "megatron_grad_fp32"},
    {TpLane::megatron_grad_bf16, "megatron_grad_bf16"},
};
inline const char* to_string(TpLane l) { return name_of(kTpLaneNames, l); }

/// What a lane reproduces (the report's and numerics.md §12's words).
struct TpLaneInfo {
  TpLane lane;
  const char* upstream;    // project, file, function, version
  const char* collective;  // the collective and the algorithm it assumes
};
inline constexpr TpLaneInfo kTpLaneInfo[] = {
    {TpLane::megatron_ar,
     "NVIDIA/Megatron-LM 000c4ac megatron/core/tensor_parallel/layers.py "
     "RowParallelLinear.forward -> reduce_from_tensor_model_parallel_region",
     "each TP rank's GEMM output in the model dtype, then NCCL all-reduce (ring, 1 channel, Simple "
     "protocol: loops of TP x 2 MiB chunks over the buffer [S_cp, B, hidden], the last loop cut "
     "as runRing does; NVIDIA/nccl 0e35f5d src/device/all_reduce.h runRing)"},
    {TpLane::megatron_sp,
     "NVIDIA/Megatron-LM 000c4ac megatron/core/tensor_parallel/layers.py "
     "RowParallelLinear.forward -> reduce_scatter_to_sequence_parallel_region",
     "each TP rank's GEMM output in the model dtype, then NCCL reduce-scatter along the sequence "
     "(ring; NVIDIA/nccl 5067397 src/device/reduce_scatter.h runRing)"},
    {TpLane::vllm_ar,
     "vllm-project/vllm 036bb68 csrc/custom_all_reduce.cuh cross_device_reduce_1stage/2stage; "
     "00d618a vllm/distributed/device_communicators/custom_all_reduce.py should_custom_ar",
     "each TP rank's GEMM output in the model dtype, then the custom all-reduce (FP32 sums, one "
     "rounding; full NVLink) below 8 MiB, NCCL ring all-reduce above"},
    {TpLane::vllm_bi,
     "vllm-project/vllm 0188c01 vllm/model_executor/layers/batch_invariant.py "
     "override_envs_for_invariance (NCCL_ALGO=allreduce:tree, 1 channel, Simple; custom "
     "all-reduce off)",
     "each TP rank's GEMM output in the model dtype, then NCCL tree all-reduce: on one node a "
     "chain rooted at rank 0, the last rank's value first (NVIDIA/nccl 5067397 "
     "src/device/all_reduce.h runTreeUpDown, src/graph/connect.cc)"},
    {TpLane::megatron_grad_fp32,
     "NVIDIA/Megatron-LM 0011998 megatron/core/distributed/param_and_grad_buffer.py "
     "_ParamAndGradBucketGroup.start_grad_sync (reduce_scatter_tensor over the DP x CP group; "
     "grad_reduce_in_fp32)",
     "each CP rank's FP32 weight gradient over its tokens, NCCL ring reduce-scatter over DP x CP "
     "(DP = 1 here) in FP32; the weight's gradient its own buffer, cut in equal parts"},
    {TpLane::megatron_grad_bf16,
     "NVIDIA/Megatron-LM 0011998 megatron/core/distributed/param_and_grad_buffer.py "
     "_ParamAndGradBucketGroup.start_grad_sync (reduce_scatter_tensor over the DP x CP group; "
     "BF16 gradients)",
     "each CP rank's weight gradient over its tokens written in BF16, NCCL ring reduce-scatter "
     "over DP x CP (DP = 1 here) in BF16; the weight's gradient its own buffer, cut in equal "
     "parts"},
};
inline const TpLaneInfo& info_of(TpLane lane) {
  for (const TpLaneInfo& i : kTpLaneInfo) {
    if (i.lane == lane) return i;
  }
  return kTpLaneInfo[0];
}

/// NCCL's ring chunk on one channel with the Simple protocol: NCCL_STEPS (8) steps of the 4 MiB
/// default buffer, ALLREDUCE_CHUNKSTEPS (4) of them a chunk (src/enqueue.cc, src/init.cc).
inline constexpr std::int64_t kNcclSimpleChunkBytes = (4 << 20) / 8 * 4;

/// vLLM's custom all-reduce is used below this many bytes (CustomAllreduce's max_size).
inline constexpr std::int64_t kVllmCustomAllreduceMaxBytes = 8192 * 1024;

/// The most ranks a lane sums (the arrays of partials its callers hold; --scope layer refuses
/// more with the lanes on).
inline constexpr int kMaxLaneRanks = 256;

/// The collective's buffer, as one rank holds it: its element count and wire type.
struct TpBuffer {
  std::int64_t count = 0;
  WireType wire = WireType::bf16;
  int elem_bytes() const { return wire == WireType::bf16 ? 2 : 4; }
};

/// NCCL's ring all-reduce chunk of element `i` of a `count`-element buffer on one channel whose
/// full loops hold `ranks · loop_chunk` elements (0: the whole buffer is one loop). The last,
/// partial loop is cut as runRing does: alignUp(divUp(rest, ranks), 16 bytes of elements).
CPD_HD int nccl_ring_chunk(std::int64_t i, std::int64_t count, int ranks, int elem_bytes,
                           std::int64_t loop_chunk = 0) {
  std::int64_t start = 0;
  if (loop_chunk > 0) {
    const std::int64_t loop = ranks * loop_chunk, full = count / loop * loop;
    if (i < full) return static_cast<int>((i % loop) / loop_chunk);
    start = full;
  }
  const std::int64_t rest = count - start, granule = 16 / elem_bytes;
  const std::int64_t chunk = ((rest + ranks - 1) / ranks + granule - 1) / granule * granule;
  return static_cast<int>((i - start) / chunk);
}

/// Lane `lane`'s value of element `i` of the buffer, from every TP rank's FP32 partial of it
/// (`partials[r]`: rank r's GEMM output before it is written in the wire type). One rank: its
/// partial written in the wire type — the canonical grid's value.
CPD_HD float tp_lane_sum(TpLane lane, const float* partials, int ranks, std::int64_t i,
                         TpBuffer buf) {
  if (lane == TpLane::megatron_grad_fp32) buf.wire = WireType::fp32;  // the lane's own wire
  if (lane == TpLane::megatron_grad_bf16) buf.wire = WireType::bf16;
  float written[kMaxLaneRanks];
  for (int r = 0; r < ranks; ++r) written[r] = to_wire(partials[r], buf.wire);
  if (ranks == 1) return written[0];
  const std::int64_t bytes = buf.count * buf.elem_bytes();
  // A reduce-scatter's part r (count / ranks elements; the last takes any rest) ends on rank r.
  const std::int64_t part = buf.count / ranks == 0 ? ranks - 1 : i / (buf.count / ranks);
  switch (lane) {
    case TpLane::megatron_sp:
    case TpLane::megatron_grad_fp32:
    case TpLane::megatron_grad_bf16:
      return ring_chunk_sum(written, ranks, static_cast<int>(part < ranks ? part : ranks - 1),
                            buf.wire);
    case TpLane::vllm_ar:
      // CustomAllreduce._SUPPORTED_WORLD_SIZES: 2, 4, 6, 8; other sizes disable it.
      if (ranks % 2 == 0 && ranks <= 8 && bytes < kVllmCustomAllreduceMaxBytes && bytes % 16 == 0) {
        if (vllm_custom_allreduce_stages(ranks, bytes) == 1)
          return vllm_one_stage_sum(written, ranks, buf.wire);
        const int owner = vllm_two_stage_owner(i, buf.count, ranks, 16 / buf.elem_bytes());
        return vllm_two_stage_sum(written, ranks, owner, buf.wire);
      }
      // From its size limit, NCCL's ring, as Megatron's.
      break;
    case TpLane::vllm_bi: {  // the chain's leaf (the last rank) first, rank 0 last
      float sum = written[ranks - 1];
      for (int r = ranks - 2; r >= 0; --r) sum = to_wire(sum + written[r], buf.wire);
      return sum;
    }
    case TpLane::megatron_ar:
      break;
  }
  const int chunk = nccl_ring_chunk(i, buf.count, ranks, buf.elem_bytes(),
                                    kNcclSimpleChunkBytes / buf.elem_bytes());
  return ring_chunk_sum(written, ranks, chunk, buf.wire);
}

}  // namespace cpd
