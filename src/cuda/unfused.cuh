// cublas_unfused: the eager-framework attention — QKᵀ and P·V as cuBLAS GEMMs (BF16 in, FP32
// compute), the softmax in its own kernel — per (row range × KV block) job, giving FP32 partial
// states like every other path.
#pragma once

#include <cublas_v2.h>

#include <span>

#include "cpdrift/cpu/attention.h"

namespace cpd::cuda {

/// Deterministic as long as `handle` forbids atomics (the backend sets
/// CUBLAS_ATOMICS_NOT_ALLOWED) and the algorithm is fixed (CUBLAS_GEMM_DEFAULT).
void run_unfused(cublasHandle_t handle, cudaStream_t stream, std::span<const BlockJob> jobs, int dim, float scale);

}  // namespace cpd::cuda
