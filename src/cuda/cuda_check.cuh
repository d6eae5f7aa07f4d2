// CPD_CUDA_CHECK / CPD_CUBLAS_CHECK: every CUDA and cuBLAS call checked, one shape for all
// (style habit 3): host, device, file:line, the decoded error, then a typed exception.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace cpd {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_cuda_error(const char* call, const char* what, const char* file, int line);

/// A one-dimensional grid of `blocks` blocks: gridDim.x holds at most 2^31 - 1.
inline unsigned grid_blocks(long long blocks) {
  if (blocks < 0 || blocks > 0x7fffffffLL) {
    throw CudaError("kernel launch of " + std::to_string(blocks) +
                    " blocks: more than one grid holds (2^31 - 1)");
  }
  return static_cast<unsigned>(blocks);
}

}  // namespace cpd

#define CPD_CUDA_CHECK(call)                                                                    \
  do {                                                                                          \
    const cudaError_t cpd_cuda_status_ = (call);                                                \
    if (cpd_cuda_status_ != cudaSuccess) {                                                      \
      ::cpd::throw_cuda_error(#call, cudaGetErrorString(cpd_cuda_status_), __FILE__, __LINE__); \
    }                                                                                           \
  } while (0)

#define CPD_CUBLAS_CHECK(call)                                                            \
  do {                                                                                    \
    const cublasStatus_t cpd_cublas_status_ = (call);                                     \
    if (cpd_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                    \
      ::cpd::throw_cuda_error(#call, cublasGetStatusString(cpd_cublas_status_), __FILE__, \
                              __LINE__);                                                  \
    }                                                                                     \
  } while (0)

/// After a kernel launch: the launch error now, the execution error at the next sync.
#define CPD_CUDA_CHECK_LAUNCH() CPD_CUDA_CHECK(cudaGetLastError())
