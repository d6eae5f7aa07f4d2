// The cuBLAS BF16 path of the layer's projections (the GEMM a production stack runs): each
// ProjectionJob's z[rows][outputs] = x · wᵀ with x and w rounded to BF16, FP32 compute and output,
// as one column-major GEMM. Host-only: the CUDA backend hands this shape to cublasGemmEx
// (kernels/cuda/projection_gemm.cu); tests/test_projection.cpp checks the mapping on the CPU.
// Not the canonical order: cuBLAS picks its own split of the reduction by shape.
#pragma once

#include <cstdint>
#include <vector>

#include "core/attention_jobs.h"

namespace cpd {

/// C = op(A) · B in cuBLAS's column-major convention: A is m×k (transposed: stored k×m with
/// leading dimension lda), B is k×n (ldb), C is m×n (ldc).
struct ColumnMajorGemm {
  bool transpose_a = false;
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
};

/// The GEMM whose column-major C is the job's row-major z [rows][outputs]: A the packed weights
/// w [outputs][dim] (row-major, so transposed), B the packed rows x [rows][dim].
ColumnMajorGemm projection_gemm(std::int64_t rows, int dim, int outputs);

/// The job's rows and weight rows as BF16 bits (round to nearest even), packed: x [rows][dim],
/// w [outputs][dim] (the job's weight rows are `ldw` apart).
void pack_projection_bf16(const ProjectionJob& job, int dim, int outputs,
                          std::vector<std::uint16_t>& x, std::vector<std::uint16_t>& w);

}  // namespace cpd
