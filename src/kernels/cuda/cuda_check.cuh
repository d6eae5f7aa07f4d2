// CPD_CUDA_CHECK / CPD_CUBLAS_CHECK: every CUDA and cuBLAS call checked, one shape for every
// library: host, rank, file:line, the decoded error (with the device), then a LibraryError.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "core/errors.h"

namespace cpd {

/// Throws the LibraryError of a failed CUDA or cuBLAS call; `what` is the library's text.
[[noreturn]] inline void throw_cuda_error(const char* library, const char* call, const char* what,
                                          const char* file, int line) {
  int device = -1;
  cudaGetDevice(&device);
  throw_library_error(library, call, std::string(what) + " (cuda:" + std::to_string(device) + ")",
                      file, line);
}

/// A one-dimensional grid of `blocks` blocks: gridDim.x holds at most 2^31 - 1 (a limit of the
/// launch cpdrift asks for, not a CUDA failure).
inline unsigned grid_blocks(long long blocks) {
  if (blocks < 0 || blocks > 0x7fffffffLL) {
    throw std::length_error("a kernel launch of " + std::to_string(blocks) +
                            " blocks: more than one grid holds (2^31 - 1)");
  }
  return static_cast<unsigned>(blocks);
}

}  // namespace cpd

#define CPD_CUDA_CHECK(call)                                                                 \
  do {                                                                                       \
    const cudaError_t cpd_cuda_status_ = (call);                                             \
    if (cpd_cuda_status_ != cudaSuccess) {                                                   \
      ::cpd::throw_cuda_error("CUDA", #call, cudaGetErrorString(cpd_cuda_status_), __FILE__, \
                              __LINE__);                                                     \
    }                                                                                        \
  } while (0)

#define CPD_CUBLAS_CHECK(call)                                                            \
  do {                                                                                    \
    const cublasStatus_t cpd_cublas_status_ = (call);                                     \
    if (cpd_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                    \
      ::cpd::throw_cuda_error("cuBLAS", #call, cublasGetStatusString(cpd_cublas_status_), \
                              __FILE__, __LINE__);                                        \
    }                                                                                     \
  } while (0)

/// After a kernel launch: the launch error now, the execution error at the next sync.
#define CPD_CUDA_CHECK_LAUNCH() CPD_CUDA_CHECK(cudaGetLastError())
