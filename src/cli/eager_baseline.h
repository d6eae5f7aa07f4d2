// The eager baseline of `cpdrift bench`: causal attention the way a framework runs it on a CPU
// (PyTorch eager's matmul + softmax + matmul): the S×S scores materialised per head with
// OpenBLAS SGEMM, masked, softmaxed, then P·V with SGEMM again. OpenBLAS is Debian's
// libopenblas.so.0, opened at run time, so nothing else in cpdrift links a BLAS.
#pragma once

#include <memory>
#include <string>

#include "core/shard.h"
#include "core/util/thread_pool.h"

namespace cpd {

class EagerAttention {
 public:
  /// Opens OpenBLAS with `threads` threads and the kernels of this CPU's widest vector unit
  /// (OPENBLAS_CORETYPE=SkylakeX with AVX-512F, Haswell with AVX2, overriding the environment's
  /// choice, which core_choice() then names): its own detection may not know a newer CPU and
  /// fall back to narrower kernels, and a baseline on them would flatter cpdrift.
  /// Throws std::runtime_error naming the library when it cannot be opened.
  explicit EagerAttention(int threads);
  ~EagerAttention();
  EagerAttention(const EagerAttention&) = delete;
  EagerAttention& operator=(const EagerAttention&) = delete;

  /// openblas_get_corename(), and how the core type was chosen.
  const std::string& corename() const { return corename_; }
  const std::string& core_choice() const { return core_choice_; }
  /// openblas_get_config().
  const std::string& config() const { return config_; }

  /// out (layout of q) and lse ([B][Hq][S]) of causal attention of q against k, v (Hkv heads,
  /// GQA) over every position; `pool` runs the masked softmax over rows.
  AttnShard forward(const Shard& q, const Shard& k, const Shard& v, float scale,
                    ThreadPool& pool) const;

 private:
  struct Library;
  std::unique_ptr<Library> lib_;
  std::string corename_, core_choice_, config_;
};

}  // namespace cpd
