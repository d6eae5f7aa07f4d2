// Statistics of what the engine computed: one rule for every comparison of every case kind.
#include <chrono>

#include "cpdrift/metrics/case_result.h"

namespace cpd {
namespace {

// Measures comparisons: whole, or one CP rank's pieces, with the candidate's digest at rank 0.
class Measurer {
 public:
  Measurer(std::span<const std::string> digests, const Collectives& collectives, ThreadPool& pool)
      : digests_(digests), collectives_(collectives), pool_(pool) {}

  DiffStats stats(const Comparison& c, std::optional<int> only_cp_rank = std::nullopt) const {
    std::vector<DiffPart> parts;
    for (const ComparedPiece& p : c.pieces) {
      if (!only_cp_rank || p.cp_rank == *only_cp_rank)
        parts.push_back(DiffPart{p.candidate, p.reference, p.count});
    }
    DiffStats s = compute_diff_stats(parts, collectives_, &pool_);
    if (!only_cp_rank && c.candidate_tensor >= 0 && collectives_.root())
      s.digest = digests_[static_cast<std::size_t>(c.candidate_tensor)];
    return s;
  }
  OutLseStats stats(const OutLseComparison& c,
                    std::optional<int> only_cp_rank = std::nullopt) const {
    return OutLseStats{stats(c.out, only_cp_rank), stats(c.lse, only_cp_rank)};
  }

 private:
  std::span<const std::string> digests_;
  const Collectives& collectives_;
  ThreadPool& pool_;
};

double seconds_since(std::chrono::steady_clock::time_point started) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

BackwardDrift measure_backward(const Measurer& m, const BackwardComparisons& c, int cp) {
  BackwardDrift b;
  b.available = true;
  b.dq = m.stats(c.dq);
  b.dk = m.stats(c.dk);
  b.dv = m.stats(c.dv);
  b.bf16_dq = m.stats(c.bf16_dq);
  b.bf16_dk = m.stats(c.bf16_dk);
  b.bf16_dv = m.stats(c.bf16_dv);
  for (int r = 0; r < cp; ++r)
    b.per_rank.push_back(
        BackwardDrift::PerRank{r, m.stats(c.dq, r), m.stats(c.dk, r), m.stats(c.dv, r)});
  return b;
}

}  // namespace

CaseResult measure_case(const CaseOutputs& o, std::span<const std::string> digests,
                        const Collectives& collectives, ThreadPool& pool) {
  const Measurer m(digests, collectives, pool);
  CaseResult r;
  r.spec = o.spec;
  r.name = o.name;
  r.cp_merge_fp32 = m.stats(o.cp_merge_fp32);
  r.dtype_path = m.stats(o.dtype_path);
  r.bf16_kernel = m.stats(o.bf16_kernel);
  r.topology = m.stats(o.topology);
  r.merge_probe = m.stats(o.merge_probe);
  r.merge_oracle = m.stats(o.merge_oracle);
  if (o.cublas_unfused) r.cublas_unfused = m.stats(*o.cublas_unfused);
  if (o.cuda_vs_cpu_fp32) r.cuda_vs_cpu_fp32 = m.stats(*o.cuda_vs_cpu_fp32);
  r.topology_required = o.topology_required;
  r.topology_reference = o.topology_reference;
  const int cp_ranks = static_cast<int>(o.executed.query_tokens.size());  // as the grid ran
  for (int cp = 0; cp < cp_ranks; ++cp) {
    r.per_rank.push_back(PerRankDrift{cp, o.executed.query_tokens[static_cast<std::size_t>(cp)],
                                      m.stats(o.dtype_path, cp), m.stats(o.cp_merge_fp32, cp)});
  }
  if (o.backward) r.backward = measure_backward(m, *o.backward, cp_ranks);
  if (o.dlogp) r.dlogp = DlogpDrift{true, o.vocab_size, m.stats(*o.dlogp)};
  r.executed = o.executed;
  r.seconds = seconds_since(o.executed.started);
  return r;
}

PagedCaseResult measure_paged_case(const PagedCaseOutputs& o, std::span<const std::string> digests,
                                   const Collectives& collectives, ThreadPool& pool) {
  const Measurer m(digests, collectives, pool);
  PagedCaseResult r;
  static_cast<PagedCaseFacts&>(r) = o;
  for (std::size_t b = 0; b < r.plans.size(); ++b) {
    if (std::string e = coverage_error(r.plans[b], o.workload.kv_lens[b]); !e.empty())
      r.coverage_errors.push_back("sequence " + std::to_string(b) + ": " + e);
  }
  r.candidate = m.stats(o.candidate);
  r.fp32 = m.stats(o.fp32);
  r.dlogp = m.stats(o.dlogp);
  for (const InvarianceCheck& inv : o.invariances)
    r.invariances.push_back(
        Invariance{inv.name, inv.compares, inv.applicable, inv.reason, m.stats(inv.rows)});
  r.seconds = seconds_since(o.started);
  return r;
}

RopeDrift measure_rope(const RopeOutputs& o, std::span<const std::string> digests,
                       const Collectives& collectives, ThreadPool& pool) {
  const Measurer m(digests, collectives, pool);
  return RopeDrift{m.stats(o.q), m.stats(o.k)};
}

}  // namespace cpd
