#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <vector>

#include "cpdrift/attention_math.h"
#include "cpdrift/bf16.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_buffer.cuh"
#include "kernels/cuda/unfused.cuh"

namespace cpd::cuda {
namespace {

constexpr int kSoftmaxThreads = 256;

// One block per (job, row): scale, causal mask, max, P = exp(S - m) (BF16 P for the second GEMM),
// the FP32 row sum l and lse. Thread t takes keys t, t + 256, …; the sum is a fixed tree
// (block_reduce.cuh), so this path is deterministic, which is all it has to be.
__global__ void softmax_kernel(const float* s, std::uint16_t* p, float* l, float* lse,
                               const long long* first_pos, const long long* key_begin,
                               const long long* key_end, long long rows, long long keys,
                               float scale) {
  __shared__ float scratch[2 * kSoftmaxThreads / 32];
  const long long job = blockIdx.x / rows, row = blockIdx.x % rows;
  const long long pos = first_pos[job] + row;
  const float* sr = s + (job * rows + row) * keys;
  std::uint16_t* pr = p + (job * rows + row) * keys;
  const long long visible = min(key_end[job], pos + 1) - key_begin[job];
  float m = neg_inf_f32();
  for (long long j = threadIdx.x; j < visible; j += blockDim.x) m = fmaxf(m, sr[j] * scale);
  m = max_first(m, static_cast<int>(threadIdx.x), scratch);
  float sum = 0.0f;
  for (long long j = threadIdx.x; j < keys; j += blockDim.x) {
    const float e = j < visible ? exp_f32(sr[j] * scale - m) : 0.0f;
    sum = sum + e;
    pr[j] = bf16_bits_rn(e);
  }
  sum = sum_fixed(sum, scratch);
  if (threadIdx.x == 0) {
    l[job * rows + row] = sum;
    lse[job * rows + row] = visible > 0 ? m + log_f32(sum) : neg_inf_f32();
  }
}

__global__ void normalize_kernel(float* o, const float* l, long long n_rows, int dim) {
  const long long row = blockIdx.x;
  if (row >= n_rows) return;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    o[row * dim + d] = l[row] > 0.0f ? o[row * dim + d] / l[row] : 0.0f;
  }
}

// Jobs of one shape run as strided batched GEMMs.
struct Group {
  std::vector<std::size_t> jobs;
};

void run_group(cublasHandle_t handle, cudaStream_t stream, std::span<const BlockJob> all,
               const Group& g, int dim, float scale) {
  const long long n = static_cast<long long>(g.jobs.size());
  const long long rows = all[g.jobs[0]].rows, keys = all[g.jobs[0]].keys.size();
  std::vector<std::uint16_t> q(n * rows * dim), k(n * keys * dim), v(n * keys * dim);
  std::vector<long long> first(n), kb(n), ke(n);
  for (long long i = 0; i < n; ++i) {
    const BlockJob& j = all[g.jobs[i]];
    for (long long x = 0; x < rows * dim; ++x) q[i * rows * dim + x] = bf16_bits_rn(j.q[x]);
    for (long long x = 0; x < keys * dim; ++x) {
      k[i * keys * dim + x] = bf16_bits_rn(j.k[x]);
      v[i * keys * dim + x] = bf16_bits_rn(j.v[x]);
    }
    first[i] = j.first_pos;
    kb[i] = j.keys.begin;
    ke[i] = j.keys.end;
  }
  const auto dq = DeviceBuffer<std::uint16_t>::from(q), dk = DeviceBuffer<std::uint16_t>::from(k),
             dv = DeviceBuffer<std::uint16_t>::from(v);
  const auto dfirst = DeviceBuffer<long long>::from(first), dkb = DeviceBuffer<long long>::from(kb),
             dke = DeviceBuffer<long long>::from(ke);
  DeviceBuffer<float> s(n * rows * keys), o(n * rows * dim), l(n * rows), lse(n * rows);
  DeviceBuffer<std::uint16_t> p(n * rows * keys);
  const float one = 1.0f, zero = 0.0f;
  // Row-major S[rows][keys] is column-major Sᵀ = K · Qᵀ.
  CPD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(keys), static_cast<int>(rows), dim, &one,
      dk.data(), CUDA_R_16BF, dim, keys * dim, dq.data(), CUDA_R_16BF, dim, rows * dim, &zero,
      s.data(), CUDA_R_32F, static_cast<int>(keys), rows * keys, static_cast<int>(n),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  softmax_rows(s.data(), p.data(), l.data(), lse.data(), dfirst.data(), dkb.data(), dke.data(), n,
               rows, keys, scale, stream);
  // Row-major O[rows][dim] is column-major Oᵀ = Vᵀ · Pᵀ.
  CPD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_N, dim, static_cast<int>(rows), static_cast<int>(keys), &one,
      dv.data(), CUDA_R_16BF, dim, keys * dim, p.data(), CUDA_R_16BF, static_cast<int>(keys),
      rows * keys, &zero, o.data(), CUDA_R_32F, dim, rows * dim, static_cast<int>(n),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  normalize_kernel<<<grid_blocks(n * rows), 128, 0, stream>>>(o.data(), l.data(), n * rows, dim);
  CPD_CUDA_CHECK_LAUNCH();
  CPD_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> host_o(n * rows * dim), host_lse(n * rows);
  o.download(host_o.data(), host_o.size());
  lse.download(host_lse.data(), host_lse.size());
  for (long long i = 0; i < n; ++i) {
    const BlockJob& j = all[g.jobs[i]];
    std::copy(host_o.begin() + i * rows * dim, host_o.begin() + (i + 1) * rows * dim, j.out);
    std::copy(host_lse.begin() + i * rows, host_lse.begin() + (i + 1) * rows, j.lse);
  }
}

}  // namespace

void softmax_rows(const float* s, std::uint16_t* p, float* l, float* lse,
                  const long long* first_pos, const long long* key_begin, const long long* key_end,
                  long long jobs, long long rows, long long keys, float scale,
                  cudaStream_t stream) {
  softmax_kernel<<<grid_blocks(jobs * rows), kSoftmaxThreads, 0, stream>>>(
      s, p, l, lse, first_pos, key_begin, key_end, rows, keys, scale);
  CPD_CUDA_CHECK_LAUNCH();
}

void run_unfused(cublasHandle_t handle, cudaStream_t stream, std::span<const BlockJob> jobs,
                 int dim, float scale) {
  std::map<std::pair<std::int64_t, std::int64_t>, Group> groups;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    groups[{jobs[i].rows, jobs[i].keys.size()}].jobs.push_back(i);
  // Jobs of a shape run in batches of at most kBatchBytes of device memory (scores, P, Q, K,
  // V, O and the row scalars), so fine splits of long sequences fit.
  constexpr std::size_t kBatchBytes = std::size_t{2} << 30;
  for (const auto& [shape, g] : groups) {
    const auto [rows, keys] = shape;
    const std::size_t per_job =
        static_cast<std::size_t>(rows) * keys * 6 + static_cast<std::size_t>(rows) * dim * 6 +
        static_cast<std::size_t>(keys) * dim * 4 + static_cast<std::size_t>(rows) * 8 + 24;
    const std::size_t batch = std::max<std::size_t>(1, kBatchBytes / per_job);
    for (std::size_t at = 0; at < g.jobs.size(); at += batch) {
      Group part;
      part.jobs.assign(
          g.jobs.begin() + static_cast<std::ptrdiff_t>(at),
          g.jobs.begin() + static_cast<std::ptrdiff_t>(std::min(g.jobs.size(), at + batch)));
      run_group(handle, stream, jobs, part, dim, scale);
    }
  }
}

}  // namespace cpd::cuda
