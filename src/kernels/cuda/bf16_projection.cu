// The layer's projections as production stacks run them: one cuBLAS GEMM per job, BF16 in, FP32
// compute and out (kernels/projection_gemm.h). Deterministic on one GPU under the backend's
// handle (no atomics, CUBLAS_GEMM_DEFAULT), but cuBLAS splits the reduction as the shape
// suggests: not the canonical order, and not the CPU's bits.
#include <vector>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_buffer.cuh"
#include "kernels/cuda/unfused.cuh"
#include "kernels/projection_gemm.h"

namespace cpd::cuda {

void project_bf16_gemm(cublasHandle_t handle, cudaStream_t stream,
                       std::span<const ProjectionJob> jobs, int dim, int outputs) {
  std::vector<std::uint16_t> x, w;
  for (const ProjectionJob& job : jobs) {
    if (job.rows == 0) continue;
    pack_projection_bf16(job, dim, outputs, x, w);
    const ColumnMajorGemm g = projection_gemm(job.rows, dim, outputs);
    const auto dx = DeviceBuffer<std::uint16_t>::from(x), dw = DeviceBuffer<std::uint16_t>::from(w);
    DeviceBuffer<float> z(static_cast<std::size_t>(job.rows) * outputs);
    const float one = 1.0f, zero = 0.0f;
    CPD_CUBLAS_CHECK(cublasGemmEx(handle, g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                                  g.m, g.n, g.k, &one, dw.data(), CUDA_R_16BF, g.lda, dx.data(),
                                  CUDA_R_16BF, g.ldb, &zero, z.data(), CUDA_R_32F, g.ldc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CPD_CUDA_CHECK(cudaStreamSynchronize(stream));
    z.download(job.z, z.size());
  }
}

}  // namespace cpd::cuda
