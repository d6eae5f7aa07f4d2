// FP32 forward kernels in the canonical order (docs/numerics.md §2–3): one CUDA block per query
// row. Scores are computed twice (for the max, then for P) rather than stored: the same
// operations give the same bits, and no S×S buffer exists.
#include "cpdrift/attention_math.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/kernels.cuh"

namespace cpd::cuda {
namespace {

constexpr int kThreads = 128;  // one thread per output column (two when dim = 256)

// The canonical partial state of one row (q in shared memory) against `n` visible keys:
// each thread's columns of out in o[], the row's max and sum returned through m and l.
__device__ void row_state(const float* q, const float* k, const float* v, int n, int dim,
                          float scale, float* p, float* scratch, float o[2], float& m, float& l) {
  const int t = threadIdx.x;
  float local = neg_inf_f32();
  int first = 0x7fffffff;
  for (int j = t; j < n; j += kThreads) {
    const float s = dot_seq(q, k + static_cast<long long>(j) * dim, dim) * scale;
    if (s > local) {
      local = s;
      first = j;
    }
  }
  m = max_first(local, first, scratch);
  o[0] = o[1] = 0.0f;
  l = 0.0f;
  for (int c = 0; c < n; c += kThreads) {
    const int j = c + t;
    if (j < n) p[t] = exp_f32(dot_seq(q, k + static_cast<long long>(j) * dim, dim) * scale - m);
    __syncthreads();
    const int count = min(kThreads, n - c);
    if (t == 0) {
      for (int x = 0; x < count; ++x) l = l + p[x];  // sequential, as defined
    }
    for (int x = 0; x < count; ++x) {
      const float pv = p[x];
      const float* vj = v + static_cast<long long>(c + x) * dim;
      if (t < dim) o[0] = fma_f32(pv, vj[t], o[0]);
      if (t + kThreads < dim) o[1] = fma_f32(pv, vj[t + kThreads], o[1]);
    }
    __syncthreads();
  }
  if (t == 0) scratch[0] = l;
  __syncthreads();
  l = scratch[0];
  __syncthreads();
}

// A row block's dynamic shared memory (shared_bytes(dim)): the query row, the block's
// probabilities, the reductions' scratch.
struct RowShared {
  float *q, *p, *scratch;
  __device__ RowShared(float* shared, int dim)
      : q(shared), p(shared + dim), scratch(shared + dim + kThreads) {}
};

__device__ void load_row(const float* src, int dim, float* q) {
  for (int d = threadIdx.x; d < dim; d += kThreads) q[d] = src[d];
  __syncthreads();
}

__global__ void forward_rows_kernel(const RowsJob* jobs, const Task* tasks, int dim, float scale) {
  extern __shared__ float shared[];
  const RowShared sh(shared, dim);
  float *q = sh.q, *p = sh.p, *scratch = sh.scratch;
  const Task task = tasks[blockIdx.x];
  const RowsJob& job = jobs[task.job];
  const long long row = task.item, pos = job.first_pos + row;
  const long long visible = min(job.key_end, pos + 1) - job.key_begin;
  const int n = static_cast<int>(visible > 0 ? visible : 0);
  float* out = job.out + row * dim;
  const int t = threadIdx.x;
  if (n == 0) {
    for (int d = t; d < dim; d += kThreads) out[d] = 0.0f;
    if (t == 0) job.lse[row] = neg_inf_f32();
    return;
  }
  load_row(job.q + row * dim, dim, q);
  float o[2], m, l;
  row_state(q, job.k, job.v, n, dim, scale, p, scratch, o, m, l);
  if (t < dim) out[t] = o[0] / l;
  if (t + kThreads < dim) out[t + kThreads] = o[1] / l;
  if (t == 0) job.lse[row] = m + log_f32(l);
}

__global__ void forward_fold_kernel(const DeviceFoldJob* jobs, const Task* tasks, int dim,
                                    float scale) {
  extern __shared__ float shared[];
  const RowShared sh(shared, dim);
  float *q = sh.q, *p = sh.p, *scratch = sh.scratch;
  const Task task = tasks[blockIdx.x];
  const DeviceFoldJob& job = jobs[task.job];
  const long long row = task.item, pos = job.first_pos + row;
  load_row(job.q + row * dim, dim, q);
  const int t = threadIdx.x;
  float acc[2] = {0.0f, 0.0f}, acc_lse = neg_inf_f32();
  for (int b = 0; b < job.nblocks; ++b) {
    const long long begin = job.blocks[2 * b], end = job.blocks[2 * b + 1];
    if (begin > pos) break;  // wholly in this row's future: the identity
    const int n = static_cast<int>(min(end, pos + 1) - begin);
    const float* k = job.k + (begin - job.kv_begin) * dim;
    const float* v = job.v + (begin - job.kv_begin) * dim;
    float o[2], m, l;
    row_state(q, k, v, n, dim, scale, p, scratch, o, m, l);
    // The block's state (out = o / l, lse = m + log l) merged into the running one.
    const float lse_b = m + log_f32(l);
    const MergeWeights w = merge_weights(acc_lse, lse_b);
    if (t < dim) acc[0] = merge_value(w, acc[0], o[0] / l);
    if (t + kThreads < dim) acc[1] = merge_value(w, acc[1], o[1] / l);
    acc_lse = w.lse;
  }
  float* out = job.out + row * dim;
  if (t < dim) out[t] = acc[0];
  if (t + kThreads < dim) out[t + kThreads] = acc[1];
  if (t == 0) job.lse[row] = acc_lse;
}

__global__ void merge_kernel(const DeviceMergeJob* jobs, const Task* tasks, int dim) {
  const Task task = tasks[blockIdx.x];
  const DeviceMergeJob& job = jobs[task.job];
  const long long row = task.item;
  float acc[2] = {0.0f, 0.0f}, acc_lse = neg_inf_f32();
  const int t = threadIdx.x;
  for (int s = 0; s < job.nstates; ++s) {
    const float* o = job.outs[s] + row * dim;
    const MergeWeights w = merge_weights(acc_lse, job.lses[s][row]);
    if (t < dim) acc[0] = merge_value(w, acc[0], o[t]);
    if (t + kThreads < dim) acc[1] = merge_value(w, acc[1], o[t + kThreads]);
    acc_lse = w.lse;
  }
  if (t < dim) job.out[row * dim + t] = acc[0];
  if (t + kThreads < dim) job.out[row * dim + t + kThreads] = acc[1];
  if (t == 0) job.lse[row] = acc_lse;
}

std::size_t shared_bytes(int dim) {
  return (static_cast<std::size_t>(dim) + kThreads + 2 * (kThreads / 32)) * 4;
}

}  // namespace

void forward_rows(const RowsJob* jobs, const Task* tasks, long long ntasks, int dim, float scale,
                  cudaStream_t stream) {
  if (ntasks == 0) return;
  forward_rows_kernel<<<grid_blocks(ntasks), kThreads, shared_bytes(dim), stream>>>(jobs, tasks,
                                                                                    dim, scale);
  CPD_CUDA_CHECK_LAUNCH();
}

void forward_fold(const DeviceFoldJob* jobs, const Task* tasks, long long ntasks, int dim,
                  float scale, cudaStream_t stream) {
  if (ntasks == 0) return;
  forward_fold_kernel<<<grid_blocks(ntasks), kThreads, shared_bytes(dim), stream>>>(jobs, tasks,
                                                                                    dim, scale);
  CPD_CUDA_CHECK_LAUNCH();
}

void merge(const DeviceMergeJob* jobs, const Task* tasks, long long ntasks, int dim,
           cudaStream_t stream) {
  if (ntasks == 0) return;
  merge_kernel<<<grid_blocks(ntasks), kThreads, 0, stream>>>(jobs, tasks, dim);
  CPD_CUDA_CHECK_LAUNCH();
}

}  // namespace cpd::cuda
