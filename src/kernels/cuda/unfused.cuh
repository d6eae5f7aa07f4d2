// cublas_unfused: the eager-framework attention — QKᵀ and P·V as cuBLAS GEMMs (BF16 in, FP32
// compute), the softmax in its own kernel — per (row range × KV block) job, giving FP32 partial
// states like every other path.
#pragma once

#include <cublas_v2.h>

#include <cstdint>
#include <span>

#include "core/attention_jobs.h"

namespace cpd::cuda {

/// Deterministic as long as `handle` forbids atomics (the backend sets
/// CUBLAS_ATOMICS_NOT_ALLOWED) and the algorithm is fixed (CUBLAS_GEMM_DEFAULT).
/// The unfused path's softmax over `jobs` × `rows` rows of `keys` FP32 scores (row-major,
/// job-major): row r of job i sits at position first_pos[i] + r and sees keys [key_begin[i],
/// min(key_end[i], position + 1)). Writes BF16 probabilities exp(scale·s − m) (0 where masked),
/// their FP32 sum l and the lse, asynchronously on `stream`.
void softmax_rows(const float* s, std::uint16_t* p, float* l, float* lse,
                  const long long* first_pos, const long long* key_begin, const long long* key_end,
                  long long jobs, long long rows, long long keys, float scale, cudaStream_t stream);

void run_unfused(cublasHandle_t handle, cudaStream_t stream, std::span<const BlockJob> jobs,
                 int dim, float scale);

/// The layer's projections as one cuBLAS BF16 GEMM per job (bf16_projection.cu): z = x · wᵀ
/// with x and w rounded to BF16, FP32 compute and output (kernels/projection_gemm.h).
void project_bf16_gemm(cublasHandle_t handle, cudaStream_t stream,
                       std::span<const ProjectionJob> jobs, int dim, int outputs);

}  // namespace cpd::cuda
