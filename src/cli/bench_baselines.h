// The yardsticks of `cpdrift bench`. On the CPU, causal attention the way a framework runs it
// (PyTorch eager's matmul + softmax + matmul): the S×S scores materialised per head with
// OpenBLAS SGEMM, masked, softmaxed, then P·V with SGEMM again; OpenBLAS is Debian's
// libopenblas.so.0, opened at run time, so nothing else in cpdrift links a BLAS. On CUDA
// (--device cuda), PyTorch's scaled_dot_product_attention, timed in a python3 subprocess.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "core/model.h"
#include "core/shard.h"
#include "core/util/thread_pool.h"

namespace cpd {

class EagerAttention {
 public:
  /// Opens OpenBLAS with `threads` threads and the kernels of this CPU's widest vector unit
  /// (OPENBLAS_CORETYPE=SkylakeX with AVX-512F, Haswell with AVX2, overriding the environment's
  /// choice, which core_choice then names): its own detection may not know a newer CPU and
  /// fall back to narrower kernels, and a baseline on them would flatter cpdrift.
  /// Throws std::runtime_error naming the library when it cannot be opened.
  explicit EagerAttention(int threads);

  /// openblas_get_corename(), how the core type was chosen, and openblas_get_config().
  std::string corename, core_choice, config;

  /// out (layout of q) and lse ([B][Hq][S]) of causal attention of q against k, v (Hkv heads,
  /// GQA) over every position; `pool` runs the masked softmax over rows.
  AttnShard forward(const Shard& q, const Shard& k, const Shard& v, float scale,
                    ThreadPool& pool) const;

 private:
  std::unique_ptr<void, int (*)(void*)> library_;  // dlopen's handle, dlclose'd
  void* sgemm_ = nullptr;                          // cblas_sgemm
};

struct TorchSdpaFigure {
  std::string backend;  // the fastest SDPA backend, e.g. "FLASH_ATTENTION"
  double seconds = 0;   // its median causal forward time on the problem's shape
  std::string torch_version;
};

/// Times every SDPA backend torch offers on BF16 inputs of the problem's shape (causal, GQA by
/// repeating K and V) on CUDA device `device`, and returns the fastest; nullopt with `why` set
/// when python3, torch or a CUDA device is missing.
std::optional<TorchSdpaFigure> time_torch_sdpa(const Problem& problem, int repeats, int device,
                                               std::string& why);

}  // namespace cpd
