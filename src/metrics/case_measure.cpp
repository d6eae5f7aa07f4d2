// Statistics of what the engine computed: one rule for every comparison of every case kind.
#include <chrono>

#include "metrics/case_result.h"

namespace cpd {
namespace {

// Measures comparisons: whole, or one CP rank's pieces, with the candidate's digest at rank 0.
class Measurer {
 public:
  Measurer(std::span<const std::string> digests, const Collectives& collectives, ThreadPool& pool)
      : digests_(digests), collectives_(collectives), pool_(pool) {}

  DiffStats stats(const Comparison& c) const { return by_rank(c, 0).front(); }
  OutLseStats stats(const OutLseComparison& c) const { return by_rank(c, 0).front(); }

  /// The comparison's statistics whole, then of each of the `cp` CP ranks' pieces (none for 0),
  /// from the same passes over the data.
  std::vector<DiffStats> by_rank(const Comparison& c, int cp) const {
    std::vector<DiffPart> parts;
    std::vector<int> rank_of;
    for (const ComparedPiece& p : c.pieces) {
      parts.push_back(DiffPart{p.candidate, p.reference, p.count, p.bf16_candidate});
      rank_of.push_back(p.cp_rank);
    }
    std::vector<DiffStats> s = compute_grouped_diff_stats(parts, rank_of, cp, collectives_, &pool_);
    if (c.candidate_tensor >= 0 && collectives_.root())
      s.front().digest = digests_[static_cast<std::size_t>(c.candidate_tensor)];
    return s;
  }
  std::vector<OutLseStats> by_rank(const OutLseComparison& c, int cp) const {
    const std::vector<DiffStats> out = by_rank(c.out, cp), lse = by_rank(c.lse, cp);
    std::vector<OutLseStats> s;
    for (std::size_t i = 0; i < out.size(); ++i) s.push_back(OutLseStats{out[i], lse[i]});
    return s;
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
  const std::vector<DiffStats> dq = m.by_rank(c.dq, cp), dk = m.by_rank(c.dk, cp),
                               dv = m.by_rank(c.dv, cp);
  b.dq = dq.front();
  b.dk = dk.front();
  b.dv = dv.front();
  b.bf16_dq = m.stats(c.bf16_dq);
  b.bf16_dk = m.stats(c.bf16_dk);
  b.bf16_dv = m.stats(c.bf16_dv);
  for (std::size_t r = 1; r < dq.size(); ++r)
    b.per_rank.push_back(BackwardDrift::PerRank{static_cast<int>(r - 1), dq[r], dk[r], dv[r]});
  if (c.te_p2p) {
    const LaneBackwardComparisons& l = *c.te_p2p;
    b.te_p2p = BackwardDrift::Lane{m.stats(l.dq),           m.stats(l.dk),
                                   m.stats(l.dv),           m.stats(l.canonical_dq),
                                   m.stats(l.canonical_dk), m.stats(l.canonical_dv)};
  }
  return b;
}

}  // namespace

void measure_case_part(const CasePart& part, std::span<const std::string> digests,
                       const Collectives& collectives, ThreadPool& pool, CaseResult& into) {
  const Measurer m(digests, collectives, pool);
  const auto set = [&](const std::optional<OutLseComparison>& c, OutLseStats& figure) {
    if (c) figure = m.stats(*c);
  };
  // The candidate and the CP merge are measured whole and per CP rank at once.
  const auto by_rank = [&](const std::optional<OutLseComparison>& c) {
    return c ? m.by_rank(*c, part.cp_ranks) : std::vector<OutLseStats>{};
  };
  const std::vector<OutLseStats> cp_merge = by_rank(part.cp_merge_fp32);
  const std::vector<OutLseStats> candidate = by_rank(part.dtype_path);
  if (!cp_merge.empty()) into.cp_merge_fp32 = cp_merge.front();
  if (!candidate.empty()) into.dtype_path = candidate.front();
  set(part.bf16_kernel, into.bf16_kernel);
  set(part.topology, into.topology);
  set(part.merge_probe, into.merge_probe);
  set(part.merge_oracle, into.merge_oracle);
  if (part.cublas_unfused) into.cublas_unfused = m.stats(*part.cublas_unfused);
  if (part.cuda_vs_cpu_fp32) into.cuda_vs_cpu_fp32 = m.stats(*part.cuda_vs_cpu_fp32);
  for (const LaneComparisons& c : part.lanes)
    into.lanes.push_back(LaneDrift{c.lane, m.stats(c.vs_reference), m.stats(c.vs_canonical)});
  if (part.dtype_path || part.cp_merge_fp32) {
    into.per_rank.resize(static_cast<std::size_t>(part.cp_ranks));
    for (std::size_t cp = 0; cp < into.per_rank.size(); ++cp) {
      PerRankDrift& r = into.per_rank[cp];
      r.cp_rank = static_cast<int>(cp);
      if (!candidate.empty()) r.candidate = candidate[cp + 1];
      if (!cp_merge.empty()) r.cp_merge = cp_merge[cp + 1];
    }
  }
  if (part.backward) into.backward = measure_backward(m, *part.backward, part.cp_ranks);
  if (part.layer) {
    into.layer.available = true;
    into.layer.out = m.stats(*part.layer);
  }
  for (const TpLaneComparisons& c : part.tp_lanes)
    into.layer.tp_lanes.push_back(
        TpLaneDrift{c.lane, c.tensor, m.stats(c.vs_reference), m.stats(c.vs_canonical)});
  for (const auto& [name, c] : part.layer_backward)
    into.layer.backward.emplace_back(name, m.stats(c));
  if (part.dlogp) {
    into.dlogp.available = true;
    into.dlogp.drift = m.stats(*part.dlogp);
    into.dlogp.rl = compute_rl_metrics(part.dlogp_tokens);
  }
}

void finish_case(const CaseRecord& record, CaseResult& into) {
  into.spec = record.spec;
  into.name = record.name;
  into.topology_required = record.topology_required;
  into.topology_reference = record.topology_reference;
  into.dlogp.vocab_size = record.vocab_size;
  const std::vector<std::vector<Range>>& tokens = record.executed.query_tokens;  // as the grid ran
  for (std::size_t cp = 0; cp < into.per_rank.size() && cp < tokens.size(); ++cp)
    into.per_rank[cp].tokens = tokens[cp];
  into.executed = record.executed;
  into.seconds = seconds_since(record.executed.started);
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
  r.dlogp_rl = compute_rl_metrics(o.dlogp_tokens);
  if (o.layer) r.layer = m.stats(*o.layer);
  for (const TpLaneComparisons& c : o.layer_tp_lanes)
    r.layer_tp_lanes.push_back(
        TpLaneDrift{c.lane, c.tensor, m.stats(c.vs_reference), m.stats(c.vs_canonical)});
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
