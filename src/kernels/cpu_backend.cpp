// The CPU backend: the tiled SIMD kernels over the thread pool.
#include <stdexcept>
#include <string>

#include "core/util/work_timers.h"
#include "cpdrift/logprob_math.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_backward.h"
#include "kernels/cpu/inputs.h"
#include "kernels/cpu/projection.h"
#include "kernels/cpu/token_sums.h"

namespace cpd {

void AttentionBackend::run_unfused_jobs(std::span<const BlockJob>, int, float) {
  throw std::logic_error(std::string("the ") + name() + " backend has no cublas_unfused path");
}

void AttentionBackend::project_heads_bf16_gemm(std::span<const ProjectionJob>, int, int) {
  throw std::logic_error(std::string("the ") + name() + " backend has no cuBLAS BF16 projection");
}

void AttentionBackend::project_folded(std::span<const FoldedProjectionJob> jobs, int dim,
                                      int vocab) {
  for (const FoldedProjectionJob& j : jobs) {
    if (j.heads.empty()) continue;
    const std::int64_t rows = j.heads.front().rows, plane = rows * vocab;
    std::vector<float> z(static_cast<std::size_t>(plane) * j.heads.size());
    std::vector<ProjectionJob> heads = j.heads;
    for (std::size_t h = 0; h < heads.size(); ++h)
      heads[h].z = z.data() + static_cast<std::int64_t>(h) * plane;
    project_heads(heads, dim, vocab);
    const auto fold = j.continues ? &continue_head_fold : &fold_head_logits;
    std::vector<const float*> terms(heads.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::size_t h = 0; h < heads.size(); ++h) terms[h] = heads[h].z + r * vocab;
      fold(terms.data(), static_cast<int>(terms.size()), vocab, j.logits + r * vocab);
    }
  }
}

void AttentionBackend::token_sums(std::span<const TokenSumJob> jobs) {
  for (const TokenSumJob& j : jobs) token_sums_reference(j);
}

namespace {

class CpuBackend final : public AttentionBackend {
 public:
  explicit CpuBackend(ThreadPool& pool) : pool_(pool) {}
  const char* name() const override { return "cpu"; }
  std::string device() const override { return "cpu"; }

  Shard generate_shard(const Problem& problem, TensorId tensor, const ShardShape& shape,
                       InputPrecision precision) override {
    const WorkTimer t(WorkKind::inputs);
    return cpd::generate_shard(problem, tensor, shape, precision, pool_);
  }
  void run_block_jobs(std::span<const BlockJob> jobs, int dim, float scale,
                      ProbRounding rounding) override {
    const WorkTimer t(WorkKind::kernels);
    cpd::run_block_jobs(jobs, dim, scale, rounding, pool_);
  }
  void run_fold_jobs(std::span<const FoldJob> jobs, int dim, float scale,
                     ProbRounding rounding) override {
    const WorkTimer t(WorkKind::kernels);
    cpd::run_fold_jobs(jobs, dim, scale, rounding, pool_);
  }
  void merge_states(std::span<const MergeJob> jobs, int dim) override {
    const WorkTimer t(WorkKind::merge);
    pool_.parallel_for(static_cast<std::int64_t>(jobs.size()), [&](std::int64_t i) {
      const MergeJob& j = jobs[static_cast<std::size_t>(i)];
      merge_in_block_order(j.states, j.rows, dim, j.out, j.lse);
    });
  }
  bool has_lane_partials() const override { return true; }
  void run_backward_units(std::span<const BackwardUnit> units, int dim, float scale) override {
    const WorkTimer t(WorkKind::kernels);
    cpd::run_backward_units(units, dim, scale, pool_);
  }
  void project_heads(std::span<const ProjectionJob> jobs, int dim, int vocab) override {
    const WorkTimer t(WorkKind::projection);
    run_projection_jobs(jobs, dim, vocab, pool_);
  }
  void project_folded(std::span<const FoldedProjectionJob> jobs, int dim, int vocab) override {
    const WorkTimer t(WorkKind::projection);
    run_folded_projection_jobs(jobs, dim, vocab, pool_);
  }
  void token_sums(std::span<const TokenSumJob> jobs) override {
    const WorkTimer t(WorkKind::projection);
    run_token_sum_jobs(jobs, pool_);
  }

 private:
  ThreadPool& pool_;
};

}  // namespace

std::unique_ptr<AttentionBackend> make_cpu_backend(ThreadPool& pool) {
  return std::make_unique<CpuBackend>(pool);
}

}  // namespace cpd
