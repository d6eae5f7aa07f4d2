// The report's production lanes (numerics.md §10): per case, each emulated stack's merge vs the
// FP32 reference and vs the canonical merge of the same states; per lane, how it varies across
// the run's topologies where the canonical grid does not.
#include "report/production_lanes_json.h"

#include <map>
#include <set>
#include <tuple>

namespace cpd {
namespace {

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

Value digest_of(const DiffStats& s) { return s.digest ? Value(*s.digest) : Value(nullptr); }

// The cases of a topology group: the same layout and split, so that only TP and CP differ.
using GroupKey = std::tuple<std::string, std::int64_t>;
GroupKey group_of(const CaseSpec& s) { return {to_string(s.layout), s.split.value_or(0)}; }

std::string group_name(const GroupKey& k) {
  const std::int64_t split = std::get<1>(k);
  return std::get<0>(k) + ", split " + (split > 0 ? std::to_string(split) : "none");
}

}  // namespace

Value lanes_case_json(const CaseResult& c) {
  Value v = Value::object();
  for (const LaneDrift& l : c.lanes) {
    Value lane = Value::object();
    lane["vs_fp32_reference"] = out_lse_json(l.vs_reference, "production_merge_drift");
    Value canon = out_lse_json(l.vs_canonical);
    canon["bitwise_equal"] = l.vs_canonical.bitwise_equal();
    lane["vs_canonical_bf16_kernel"] = std::move(canon);
    v[to_string(l.lane)] = std::move(lane);
  }
  return v;
}

Value production_lanes_json(const RunReport& r) {
  Value v = Value::object();
  v["states"] =
      "the bf16_kernel path's partial states: each CP rank's blocks folded in block order (its "
      "kernel call), written as BF16, then merged as the stack does (docs/numerics.md section 10)";
  v["ring_order"] = "step i on CP rank r holds the K/V of rank (r - i) mod CP, the diagonal first";
  Value lanes = Value::object();
  for (const ProductionLane lane : kProductionLanes) {
    Value l = Value::object();
    l["stack"] = lane_stack(lane);
    Value cases = Value::array();
    std::map<GroupKey, std::set<std::string>> lane_digests, canonical_digests;
    std::map<GroupKey, std::size_t> group_cases;
    for (const CaseResult& c : r.cases) {
      for (const LaneDrift& d : c.lanes) {
        if (d.lane != lane) continue;
        Value e = Value::object();
        e["case_name"] = c.name;
        e["tp"] = c.spec.tp;
        e["cp"] = c.spec.cp;
        const auto figure = [](const DiffStats& s, double v) {
          return s.finite() ? Value(v) : Value(nullptr);
        };
        const DiffStats& lane_out = d.vs_reference.out;
        const DiffStats& canonical_out = c.bf16_kernel.out;
        e["out_max_abs_vs_fp32"] = figure(lane_out, lane_out.max_abs);
        e["out_mean_abs_vs_fp32"] = figure(lane_out, lane_out.mean_abs);
        e["canonical_out_max_abs_vs_fp32"] = figure(canonical_out, canonical_out.max_abs);
        e["canonical_out_mean_abs_vs_fp32"] = figure(canonical_out, canonical_out.mean_abs);
        e["out_mismatches_vs_canonical"] = d.vs_canonical.out.mismatch_count;
        e["bitwise_equal_canonical"] = d.vs_canonical.bitwise_equal();
        e["out_digest"] = digest_of(d.vs_reference.out);
        cases.push_back(std::move(e));
        const GroupKey g = group_of(c.spec);
        ++group_cases[g];
        if (d.vs_reference.out.digest) lane_digests[g].insert(*d.vs_reference.out.digest);
        if (c.bf16_kernel.out.digest) canonical_digests[g].insert(*c.bf16_kernel.out.digest);
      }
    }
    l["cases"] = std::move(cases);
    Value groups = Value::array();
    for (const auto& [g, n] : group_cases) {
      Value e = Value::object();
      e["layout_and_split"] = group_name(g);
      e["cases"] = n;
      e["distinct_out_digests"] = lane_digests[g].size();
      e["canonical_distinct_out_digests"] = canonical_digests[g].size();
      groups.push_back(std::move(e));
    }
    l["topology_variance"] = std::move(groups);
    lanes[to_string(lane)] = std::move(l);
  }
  v["lanes"] = std::move(lanes);
  return v;
}

}  // namespace cpd
