// Block-wide reductions with results that do not depend on thread scheduling.
#pragma once

#include "cpdrift/hd.h"

namespace cpd::cuda {

/// The (value, index) pair of the warp's maximum, ties to the lowest index, in lane 0.
__device__ inline void warp_max_first(float& value, int& index) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float v = __shfl_down_sync(0xffffffffu, value, offset);
    const int i = __shfl_down_sync(0xffffffffu, index, offset);
    if (v > value || (v == value && i < index)) {
      value = v;
      index = i;
    }
  }
}

/// The maximum of the block's (value, index) pairs where ties go to the lowest index — the
/// result of the canonical sequential fold `m = (s > m) ? s : m` over ascending indices, which
/// keeps the first of equal values (this matters only for +0 vs -0). `scratch` needs
/// 2·blockDim.x/32 words. Every thread gets the result.
__device__ inline float max_first(float value, int index, float* scratch) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  warp_max_first(value, index);
  int* idx = reinterpret_cast<int*>(scratch + warps);
  if (lane == 0) {
    scratch[warp] = value;
    idx[warp] = index;
  }
  __syncthreads();
  if (warp == 0) {
    value = lane < warps ? scratch[lane] : neg_inf_f32();
    index = lane < warps ? idx[lane] : 0x7fffffff;
    warp_max_first(value, index);
    if (lane == 0) scratch[0] = value;
  }
  __syncthreads();
  const float result = scratch[0];
  __syncthreads();
  return result;
}

/// The block's sum in a fixed tree (lane shuffles, then the warps' partials in warp order): the
/// same bits on every run for a given blockDim. `scratch` needs blockDim.x/32 words. Every
/// thread gets the result.
__device__ inline float sum_fixed(float value, float* scratch) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_down_sync(0xffffffffu, value, offset);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < warps ? scratch[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2)
      value += __shfl_down_sync(0xffffffffu, value, offset);
    if (lane == 0) scratch[0] = value;
  }
  __syncthreads();
  const float result = scratch[0];
  __syncthreads();
  return result;
}

}  // namespace cpd::cuda
