// The report's production lanes (numerics.md §10): per case, each emulated stack's merge vs the
// FP32 reference and vs the canonical merge of the same states; per lane, how it varies across
// the run's topologies where the canonical grid does not.
#include <map>
#include <set>
#include <utility>

#include "report/plan_json.h"

namespace cpd {
namespace {

using json::Object;
using json::Value;

const char* lane_stack(ProductionLane l) {
  switch (l) {
    case ProductionLane::te_p2p:
      return "Transformer Engine P2P ring (AttnFuncWithCPAndKVP2P): ring order, LSE folded in "
             "FP32 with log1p, running output in BF16";
    case ProductionLane::ring_fp32:
      return "ring-flash-attention (_update_out_and_lse): ring order, FP32 running output, "
             "sigmoid update";
    case ProductionLane::nccl_rs:
      return "vLLM decode CP (cp_lse_ag_out_rs): outputs rescaled into BF16, summed by a ring "
             "reduce-scatter in BF16";
  }
  return "?";
}

// A topology group: the cases of the same layout and split (0: none), so that only TP and CP
// differ; ordered by layout, then split.
using GroupKey = std::pair<std::string, std::int64_t>;
struct Group {
  std::size_t cases = 0;
  std::set<std::string> lane_digests, canonical_digests;
};

Value lane_case_json(const CaseResult& c, const LaneDrift& d) {
  const DiffStats& lane_out = d.vs_reference.out;
  const DiffStats& canonical_out = c.bf16_kernel.out;
  return Object{
      {"case_name", c.name},
      {"tp", c.spec.tp},
      {"cp", c.spec.cp},
      {"out_max_abs_vs_fp32", finite_or_null(lane_out, lane_out.max_abs)},
      {"out_mean_abs_vs_fp32", finite_or_null(lane_out, lane_out.mean_abs)},
      {"canonical_out_max_abs_vs_fp32", finite_or_null(canonical_out, canonical_out.max_abs)},
      {"canonical_out_mean_abs_vs_fp32", finite_or_null(canonical_out, canonical_out.mean_abs)},
      {"out_mismatches_vs_canonical", d.vs_canonical.out.mismatch_count},
      {"bitwise_equal_canonical", d.vs_canonical.bitwise_equal()},
      {"out_digest", json::nullable(lane_out.digest)}};
}

}  // namespace

Value lanes_case_json(const CaseResult& c) {
  Value v = Value::object();
  for (const LaneDrift& l : c.lanes) {
    Value canon = out_lse_json(l.vs_canonical);
    canon["bitwise_equal"] = l.vs_canonical.bitwise_equal();
    v[to_string(l.lane)] =
        Object{{"vs_fp32_reference", out_lse_json(l.vs_reference, "production_merge_drift")},
               {"vs_canonical_bf16_kernel", std::move(canon)}};
  }
  return v;
}

Value production_lanes_json(const RunReport& r) {
  Value lanes = Value::object();
  for (const ProductionLane lane : kProductionLanes) {
    Value cases = Value::array();
    std::map<GroupKey, Group> groups;
    for (const CaseResult& c : r.cases) {
      for (const LaneDrift& d : c.lanes) {
        if (d.lane != lane) continue;
        cases.push_back(lane_case_json(c, d));
        Group& g = groups[{to_string(c.spec.layout), c.spec.split.value_or(0)}];
        ++g.cases;
        if (d.vs_reference.out.digest) g.lane_digests.insert(*d.vs_reference.out.digest);
        if (c.bf16_kernel.out.digest) g.canonical_digests.insert(*c.bf16_kernel.out.digest);
      }
    }
    Value variance = Value::array();
    for (const auto& [key, g] : groups) {
      const std::string split = key.second > 0 ? std::to_string(key.second) : "none";
      variance.push_back(Object{{"layout_and_split", key.first + ", split " + split},
                                {"cases", g.cases},
                                {"distinct_out_digests", g.lane_digests.size()},
                                {"canonical_distinct_out_digests", g.canonical_digests.size()}});
    }
    lanes[to_string(lane)] = Object{{"stack", lane_stack(lane)},
                                    {"cases", std::move(cases)},
                                    {"topology_variance", std::move(variance)}};
  }
  return Object{
      {"states",
       "the bf16_kernel path's partial states: each CP rank's blocks folded in block order (its "
       "kernel call), written as BF16, then merged as the stack does (docs/numerics.md section "
       "10)"},
      {"ring_order",
       "step i on CP rank r holds the K/V of rank (r - i) mod CP, the diagonal first"},
      {"lanes", std::move(lanes)}};
}

}  // namespace cpd
