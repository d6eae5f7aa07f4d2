// Statistics of what the engine computed: one rule for every comparison of every case kind.
#include <chrono>
#include <utility>
#include <vector>

#include "metrics/case_result.h"

namespace cpd {
namespace {

// Measures comparisons into their places in a result, whole or one CP rank's pieces at a time,
// and attaches the candidates' digests (rank 0) once all of them are measured: a tensor still
// being hashed then keeps the statistics waiting only for what they did not cover (0.05 s of
// the bench's whole case at S = 4096, docs/performance.md). A place must stay where it is until
// attach_digests().
class Measurer {
 public:
  Measurer(const PublishedDigests& digests, const Collectives& collectives, ThreadPool& pool)
      : digests_(digests), collectives_(collectives), pool_(pool) {}

  void measure(const Comparison& c, DiffStats& into) {
    into = compute_diff_stats(parts_of(c), collectives_, &pool_);
    digest_later(c, into);
  }
  void measure(const OutLseComparison& c, OutLseStats& into) {
    measure(c.out, into.out);
    measure(c.lse, into.lse);
  }

  /// The comparison's statistics whole into `whole`, and of each of the `cp` CP ranks' pieces
  /// (returned, rank by rank), from the same passes over the data.
  std::vector<DiffStats> by_rank(const Comparison& c, int cp, DiffStats& whole) {
    std::vector<int> rank_of;
    for (const ComparedPiece& p : c.pieces) rank_of.push_back(p.cp_rank);
    std::vector<DiffStats> s =
        compute_grouped_diff_stats(parts_of(c), rank_of, cp, collectives_, &pool_);
    whole = std::move(s.front());
    digest_later(c, whole);
    s.erase(s.begin());
    return s;
  }
  std::vector<OutLseStats> by_rank(const OutLseComparison& c, int cp, OutLseStats& whole) {
    const std::vector<DiffStats> out = by_rank(c.out, cp, whole.out),
                                 lse = by_rank(c.lse, cp, whole.lse);
    std::vector<OutLseStats> s;
    for (std::size_t i = 0; i < out.size(); ++i) s.push_back(OutLseStats{out[i], lse[i]});
    return s;
  }

  /// The digests of the candidates measured so far, each into its comparison's statistics.
  void attach_digests() {
    for (const auto& [stats, tensor] : pending_) stats->digest = digests_.at(tensor);
    pending_.clear();
  }

 private:
  static std::vector<DiffPart> parts_of(const Comparison& c) {
    std::vector<DiffPart> parts;
    for (const ComparedPiece& p : c.pieces)
      parts.push_back(DiffPart{p.candidate, p.reference, p.count, p.bf16_candidate});
    return parts;
  }
  void digest_later(const Comparison& c, DiffStats& s) {
    if (c.candidate_tensor >= 0 && collectives_.root())
      pending_.emplace_back(&s, static_cast<std::size_t>(c.candidate_tensor));
  }

  const PublishedDigests& digests_;
  const Collectives& collectives_;
  ThreadPool& pool_;
  std::vector<std::pair<DiffStats*, std::size_t>> pending_;  // statistics, candidate tensor
};

double seconds_since(std::chrono::steady_clock::time_point started) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void measure_backward(Measurer& m, const BackwardComparisons& c, int cp, BackwardDrift& b) {
  b = BackwardDrift{};
  b.available = true;
  const std::vector<DiffStats> dq = m.by_rank(c.dq, cp, b.dq), dk = m.by_rank(c.dk, cp, b.dk),
                               dv = m.by_rank(c.dv, cp, b.dv);
  m.measure(c.bf16_dq, b.bf16_dq);
  m.measure(c.bf16_dk, b.bf16_dk);
  m.measure(c.bf16_dv, b.bf16_dv);
  for (std::size_t r = 0; r < dq.size(); ++r)
    b.per_rank.push_back(BackwardDrift::PerRank{static_cast<int>(r), dq[r], dk[r], dv[r]});
  if (c.te_p2p) {
    const LaneBackwardComparisons& l = *c.te_p2p;
    BackwardDrift::Lane& lane = b.te_p2p.emplace();
    m.measure(l.dq, lane.dq);
    m.measure(l.dk, lane.dk);
    m.measure(l.dv, lane.dv);
    m.measure(l.canonical_dq, lane.canonical_dq);
    m.measure(l.canonical_dk, lane.canonical_dk);
    m.measure(l.canonical_dv, lane.canonical_dv);
  }
}

}  // namespace

void measure_case_part(const CasePart& part, const PublishedDigests& digests,
                       const Collectives& collectives, ThreadPool& pool, CaseResult& into) {
  Measurer m(digests, collectives, pool);
  const auto set = [&](const std::optional<OutLseComparison>& c, OutLseStats& figure) {
    if (c) m.measure(*c, figure);
  };
  // The candidate and the CP merge are measured whole and per CP rank at once.
  const auto by_rank = [&](const std::optional<OutLseComparison>& c, OutLseStats& whole) {
    return c ? m.by_rank(*c, part.cp_ranks, whole) : std::vector<OutLseStats>{};
  };
  const std::vector<OutLseStats> cp_merge = by_rank(part.cp_merge_fp32, into.cp_merge_fp32);
  const std::vector<OutLseStats> candidate = by_rank(part.dtype_path, into.dtype_path);
  set(part.bf16_kernel, into.bf16_kernel);
  set(part.topology, into.topology);
  set(part.merge_probe, into.merge_probe);
  set(part.merge_oracle, into.merge_oracle);
  if (part.cublas_unfused) m.measure(*part.cublas_unfused, into.cublas_unfused.emplace());
  if (part.cuda_vs_cpu_fp32) m.measure(*part.cuda_vs_cpu_fp32, into.cuda_vs_cpu_fp32.emplace());
  const std::size_t first_lane = into.lanes.size();
  for (const LaneComparisons& c : part.lanes) into.lanes.push_back(LaneDrift{c.lane, {}, {}});
  for (std::size_t i = 0; i < part.lanes.size(); ++i) {
    LaneDrift& lane = into.lanes[first_lane + i];
    m.measure(part.lanes[i].vs_reference, lane.vs_reference);
    m.measure(part.lanes[i].vs_canonical, lane.vs_canonical);
  }
  if (part.dtype_path || part.cp_merge_fp32) {
    into.per_rank.resize(static_cast<std::size_t>(part.cp_ranks));
    for (std::size_t cp = 0; cp < into.per_rank.size(); ++cp) {
      PerRankDrift& r = into.per_rank[cp];
      r.cp_rank = static_cast<int>(cp);
      if (!candidate.empty()) r.candidate = candidate[cp];
      if (!cp_merge.empty()) r.cp_merge = cp_merge[cp];
    }
  }
  if (part.backward) measure_backward(m, *part.backward, part.cp_ranks, into.backward);
  if (part.dlogp) {
    into.dlogp.available = true;
    m.measure(*part.dlogp, into.dlogp.drift);
    into.dlogp.rl = compute_rl_metrics(part.dlogp_tokens);
  }
  m.attach_digests();
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

PagedCaseResult measure_paged_case(const PagedCaseOutputs& o, const PublishedDigests& digests,
                                   const Collectives& collectives, ThreadPool& pool) {
  Measurer m(digests, collectives, pool);
  PagedCaseResult r;
  static_cast<PagedCaseFacts&>(r) = o;
  for (std::size_t b = 0; b < r.plans.size(); ++b) {
    if (std::string e = coverage_error(r.plans[b], o.workload.kv_lens[b]); !e.empty())
      r.coverage_errors.push_back("sequence " + std::to_string(b) + ": " + e);
  }
  m.measure(o.candidate, r.candidate);
  m.measure(o.fp32, r.fp32);
  m.measure(o.dlogp, r.dlogp);
  r.dlogp_rl = compute_rl_metrics(o.dlogp_tokens);
  for (const InvarianceCheck& inv : o.invariances)
    r.invariances.push_back(Invariance{inv.name, inv.compares, inv.applicable, inv.reason, {}});
  for (std::size_t i = 0; i < o.invariances.size(); ++i)
    m.measure(o.invariances[i].rows, r.invariances[i].stats);
  m.attach_digests();
  r.seconds = seconds_since(o.started);
  return r;
}

RopeDrift measure_rope(const RopeOutputs& o, const PublishedDigests& digests,
                       const Collectives& collectives, ThreadPool& pool) {
  Measurer m(digests, collectives, pool);
  RopeDrift r;
  m.measure(o.q, r.q);
  m.measure(o.k, r.k);
  m.attach_digests();
  return r;
}

}  // namespace cpd
