// The compute backend seam (docs/style.md): the engine asks for inputs, partial states, merges,
// gradients and logit projections here, and the CPU and CUDA backends answer with the same
// bits (docs/numerics.md). Host-only: no CUDA type appears in this header.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/attention_jobs.h"
#include "core/model.h"
#include "core/shard.h"
#include "core/util/thread_pool.h"
#include "cpdrift/attention_math.h"
#include "cpdrift/philox.h"

namespace cpd {

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  /// "cpu" or "cuda".
  virtual const char* name() const = 0;
  /// The report's runtime.device: "cpu" or "cuda:N".
  virtual std::string device() const = 0;

  /// The same values as generate_shard (inputs.h).
  virtual Shard generate_shard(const Problem& problem, TensorId tensor, const ShardShape& shape,
                               InputPrecision precision) = 0;
  /// Partial states of rows against blocks, and whole CP=1 folds (core/attention_jobs.h).
  virtual void run_block_jobs(std::span<const BlockJob> jobs, int dim, float scale,
                              ProbRounding rounding) = 0;
  virtual void run_fold_jobs(std::span<const FoldJob> jobs, int dim, float scale,
                             ProbRounding rounding) = 0;
  /// The ordered merge of each job's states.
  virtual void merge_states(std::span<const MergeJob> jobs, int dim) = 0;
  /// Backward block pairs.
  virtual void run_backward_units(std::span<const BackwardUnit> units, int dim, float scale) = 0;
  /// Whether run_backward_units fills the query blocks' dk_lane / dv_lane (the te_p2p
  /// backward lane's per-rank sums); a backend that does not is never given them.
  virtual bool has_lane_partials() const { return false; }
  /// The layer's weight gradients: token sums (TokenSumJob). By default the definition on the
  /// host; the CPU backend tiles it.
  virtual void token_sums(std::span<const TokenSumJob> jobs);
  /// dlogp's per-head partial logits.
  virtual void project_heads(std::span<const ProjectionJob> jobs, int dim, int vocab) = 0;
  /// dlogp's logits folded over a token owner's heads, the same bits as project_heads followed
  /// by fold_head_logits; by default exactly that (on the host), the CPU backend folds each
  /// vocabulary block in cache as the heads' partials come out of its projection tile.
  virtual void project_folded(std::span<const FoldedProjectionJob> jobs, int dim, int vocab);

  /// The layer's projections as a production stack runs them: z = x · wᵀ, x and w rounded to
  /// BF16, one cuBLAS GEMM per job with FP32 compute and output (kernels/projection_gemm.h; not
  /// the canonical order). GPU backends only.
  virtual bool has_bf16_gemm_projection() const { return false; }
  virtual void project_heads_bf16_gemm(std::span<const ProjectionJob> jobs, int dim, int outputs);

  /// The cublas_unfused path (design §3): QKᵀ and P·V as BF16 GEMMs with FP32 compute, the
  /// softmax in its own kernel; the jobs' q, k, v hold BF16 values. GPU backends only.
  virtual bool has_unfused_gemm() const { return false; }
  virtual void run_unfused_jobs(std::span<const BlockJob> jobs, int dim, float scale);
};

/// The CPU backend over a thread pool.
std::unique_ptr<AttentionBackend> make_cpu_backend(ThreadPool& pool);

/// The CUDA backend on `device` (0-based). Throws UsageError("… built without CUDA …") in a
/// build without the CUDA backend, and UsageError when there is no such device.
std::unique_ptr<AttentionBackend> make_cuda_backend(int device);

/// One timed figure of `cpdrift bench --device cuda`: the median seconds of one causal CP=1
/// forward over the whole problem, or of the layer's q_proj over every token.
struct DeviceBenchFigure {
  std::string name;  // fp32_reference, bf16_kernel, cublas_unfused, q_proj fp32_canonical, …
  double seconds = 0;
  double flops = 0;  // the figure's work; 0: the attention forward's
};

/// Times the CUDA paths on `device` with device-resident inputs (CUDA events, median of
/// `repeats` after one warm-up). Throws UsageError in a build without the CUDA backend.
std::vector<DeviceBenchFigure> cuda_bench(const Problem& problem, int repeats, int device);

/// Whether this build has the CUDA backend, and how many CUDA devices this process sees (0
/// without the backend or without devices).
bool cuda_backend_built();
int cuda_device_count();
/// The CUDA runtime's version as "major.minor", or "" without the backend.
std::string cuda_runtime_version();

}  // namespace cpd
