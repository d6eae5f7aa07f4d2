// FP32 backward kernels in the canonical order (docs/numerics.md §6). dq: one block per query
// row of a unit; dk/dv: one block per key of a unit. Both recompute P and dS from the inputs,
// which gives the same bits in both places.
#include "cpdrift/attention_backward_math.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/kernels.cuh"

namespace cpd::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void dq_kernel(const DeviceBackwardUnit* units, const Task* tasks, int dim,
                          float scale) {
  __shared__ float ds[kThreads];
  const Task task = tasks[blockIdx.x];
  const DeviceBackwardUnit& u = units[task.job];
  // Which query block the row is in (blocks are few).
  long long item = task.item;
  int b = 0;
  for (;; ++b) {
    const long long size = u.blocks[b].end - u.blocks[b].begin;
    if (item < size) break;
    item -= size;
  }
  const DeviceBackwardBlock& qb = u.blocks[b];
  const long long row = item, pos = qb.begin + row;
  const float* q = qb.q + row * dim;
  const float* d_out = qb.d_out + row * dim;
  const float lse = qb.lse[row], delta = qb.delta[row];
  const long long visible = min(u.key_end, pos + 1) - u.key_begin;
  const int n = static_cast<int>(visible > 0 ? visible : 0);
  const int t = threadIdx.x;
  float acc[2] = {0.0f, 0.0f};
  for (int c = 0; c < n; c += kThreads) {
    const int j = c + t;
    if (j < n) {
      float p;
      backward_pair(q, u.k + static_cast<long long>(j) * dim, d_out,
                    u.v + static_cast<long long>(j) * dim, scale, lse, delta, dim, &p, &ds[t]);
    }
    __syncthreads();
    const int count = min(kThreads, n - c);
    for (int x = 0; x < count; ++x) {
      const float* kj = u.k + static_cast<long long>(c + x) * dim;
      if (t < dim) acc[0] = fma_f32(ds[x], kj[t], acc[0]);
      if (t + kThreads < dim) acc[1] = fma_f32(ds[x], kj[t + kThreads], acc[1]);
    }
    __syncthreads();
  }
  float* out = qb.dq_partial + row * dim;
  if (t < dim) out[t] = acc[0];
  if (t + kThreads < dim) out[t + kThreads] = acc[1];
}

__global__ void dkdv_kernel(const DeviceBackwardUnit* units, const Task* tasks, int dim,
                            float scale) {
  __shared__ float ds[kThreads], pr[kThreads];
  const Task task = tasks[blockIdx.x];
  const DeviceBackwardUnit& u = units[task.job];
  const long long j = task.item, key = u.key_begin + j;
  const float* k = u.k + j * dim;
  const float* v = u.v + j * dim;
  const int t = threadIdx.x;
  float dk_total[2] = {0.0f, 0.0f}, dv_total[2] = {0.0f, 0.0f};
  if (u.accumulate != 0) {
    for (int c = 0; c < 2; ++c) {
      const int d = t + c * kThreads;
      if (d < dim) {
        dk_total[c] = u.dk_total[j * dim + d];
        dv_total[c] = u.dv_total[j * dim + d];
      }
    }
  }
  for (int b = 0; b < u.nblocks; ++b) {
    const DeviceBackwardBlock& qb = u.blocks[b];
    // Rows before the key cannot see it; the partial sums the visible ones in order.
    const long long first = max(key, qb.begin) - qb.begin;
    const long long n = qb.end - qb.begin;
    float dk[2] = {0.0f, 0.0f}, dv[2] = {0.0f, 0.0f};
    for (long long c = first; c < n; c += kThreads) {
      const long long i = c + t;
      if (i < n) {
        backward_pair(qb.q + i * dim, k, qb.d_out + i * dim, v, scale, qb.lse[i], qb.delta[i], dim,
                      &pr[t], &ds[t]);
      }
      __syncthreads();
      const int count = static_cast<int>(min(static_cast<long long>(kThreads), n - c));
      for (int x = 0; x < count; ++x) {
        const float* qi = qb.q + (c + x) * dim;
        const float* oi = qb.d_out + (c + x) * dim;
        if (t < dim) {
          dk[0] = fma_f32(ds[x], qi[t], dk[0]);
          dv[0] = fma_f32(pr[x], oi[t], dv[0]);
        }
        if (t + kThreads < dim) {
          dk[1] = fma_f32(ds[x], qi[t + kThreads], dk[1]);
          dv[1] = fma_f32(pr[x], oi[t + kThreads], dv[1]);
        }
      }
      __syncthreads();
    }
    const bool starts = b == 0 && u.accumulate == 0;  // the fold's first term
    for (int c = 0; c < 2; ++c) {
      dk_total[c] = starts ? dk[c] : dk_total[c] + dk[c];
      dv_total[c] = starts ? dv[c] : dv_total[c] + dv[c];
    }
  }
  float* dk_out = u.dk_total + j * dim;
  float* dv_out = u.dv_total + j * dim;
  if (t < dim) {
    dk_out[t] = dk_total[0];
    dv_out[t] = dv_total[0];
  }
  if (t + kThreads < dim) {
    dk_out[t + kThreads] = dk_total[1];
    dv_out[t + kThreads] = dv_total[1];
  }
}

}  // namespace

void backward_dq(const DeviceBackwardUnit* units, const Task* tasks, long long ntasks, int dim,
                 float scale, cudaStream_t stream) {
  if (ntasks == 0) return;
  dq_kernel<<<grid_blocks(ntasks), kThreads, 0, stream>>>(units, tasks, dim, scale);
  CPD_CUDA_CHECK_LAUNCH();
}

void backward_dkdv(const DeviceBackwardUnit* units, const Task* tasks, long long ntasks, int dim,
                   float scale, cudaStream_t stream) {
  if (ntasks == 0) return;
  dkdv_kernel<<<grid_blocks(ntasks), kThreads, 0, stream>>>(units, tasks, dim, scale);
  CPD_CUDA_CHECK_LAUNCH();
}

}  // namespace cpd::cuda
