// The human table's TP-reduction lanes (--scope layer, numerics.md §12): each case's layer output
// through the stacks' sums over TP ranks, and the trainer-vs-rollout pairs through them.
#include <algorithm>

#include "cli/commands.h"
#include "cli/human_format.h"

namespace cpd {
namespace {

// A lane's cell: its mean |Δ| vs the reference, the share of its bits that differ from the
// canonical output, and its digest's first 8 hex digits (prefill cases).
std::string lane_cell(const TpLaneDrift& l) {
  char cell[64];
  const std::string bits = l.vs_canonical.bitwise_equal() ? "= canon" : differing(l.vs_canonical);
  std::snprintf(cell, sizeof cell, " %-9.3e %-7s %-8s", l.vs_reference.mean_abs, bits.c_str(),
                l.vs_reference.digest ? l.vs_reference.digest->substr(0, 8).c_str() : "");
  return cell;
}

std::string lanes_head(const std::vector<TpLaneDrift>& lanes, std::size_t width) {
  std::string head;
  for (const TpLaneDrift& l : lanes) {
    if (l.tensor == "out") head += " " + padded(to_string(l.lane), width);
  }
  return head;
}

// A case's row of `tensor`'s lanes, after the canonical figure `canonical`.
void print_lane_row(std::FILE* out, const std::string& name, double canonical,
                    const std::vector<TpLaneDrift>& lanes, const char* tensor) {
  char cell[32];
  std::snprintf(cell, sizeof cell, "%-10.3e", canonical);
  std::string row = "  " + padded(name, 46) + " " + cell;
  for (const TpLaneDrift& l : lanes) {
    if (l.tensor == tensor) row += lane_cell(l);
  }
  std::fprintf(out, "%s\n", trimmed(row).c_str());
}

// dX's canonical figure (the layer's backward), or 0 when it did not run.
double dx_mean(const CaseResult& c) {
  for (const auto& [name, s] : c.layer.backward) {
    if (name == "dx") return s.mean_abs;
  }
  return 0.0;
}

// The weight gradients' reduce-scatter lanes (--include-backward): per case and lane, the largest
// mean |Δ| vs the reference's gradient over the weights, and the largest share of bits that
// differ from the canonical gradient written alike.
void print_gradient_lane_rows(std::FILE* out, const RunReport& r) {
  std::vector<TpLane> lanes;
  for (const TpLaneDrift& l : r.cases.front().layer.tp_lanes) {
    if (l.tensor != "out" && l.tensor != "dx" &&
        std::find(lanes.begin(), lanes.end(), l.lane) == lanes.end())
      lanes.push_back(l.lane);
  }
  if (lanes.empty()) return;
  std::string head =
      "# " + padded("weight gradients over DP x CP", 46) + " " + padded("canonical", 10);
  for (const TpLane lane : lanes) head += " " + padded(to_string(lane), 26);
  std::fprintf(out,
               "# the weight gradients' reduce-scatter over DP x CP: the largest mean |Δ| over the "
               "weights vs the reference's\n# (canonical: the FP32 gradients'), the largest share "
               "of bits that differ from the canonical gradient written alike\n%s\n",
               trimmed(head).c_str());
  for (const CaseResult& c : r.cases) {
    double canonical = 0;
    for (const auto& [name, s] : c.layer.backward) {
      if (name != "dx" && name != "q_norm" && name != "k_norm")
        canonical = std::max(canonical, s.mean_abs);
    }
    char cell[64];
    std::snprintf(cell, sizeof cell, "%-10.3e", canonical);
    std::string row = "  " + padded(c.name, 46) + " " + cell;
    for (const TpLane lane : lanes) {
      double mean = 0;
      const DiffStats* most = nullptr;  // the gradient with the largest share of differing bits
      const auto share = [](const DiffStats& s) {
        return static_cast<double>(s.mismatch_count) /
               static_cast<double>(std::max<std::uint64_t>(s.active_count, 1));
      };
      for (const TpLaneDrift& l : c.layer.tp_lanes) {
        if (l.lane != lane) continue;
        mean = std::max(mean, l.vs_reference.mean_abs);
        if (most == nullptr || share(l.vs_canonical) > share(*most)) most = &l.vs_canonical;
      }
      const std::string bits =
          most == nullptr || most->bitwise_equal() ? "= canon" : differing(*most);
      std::snprintf(cell, sizeof cell, " %-9.3e %-16s", mean, bits.c_str());
      row += cell;
    }
    std::fprintf(out, "%s\n", trimmed(row).c_str());
  }
}

}  // namespace

void print_tp_lane_rows(std::FILE* out, const RunReport& r) {
  const bool trainer = !r.cases.empty() && !r.cases.front().layer.tp_lanes.empty();
  const bool rollout = !r.paged_cases.empty() && !r.paged_cases.front().layer_tp_lanes.empty();
  if (!trainer && !rollout) return;
  std::fprintf(out,
               "#\n# the stacks' sums over TP ranks in o_proj, emulated (numerics.md §12): each TP "
               "rank's partial written in %s, then\n# its collective; mean |Δ| vs the FP32 CP=1 "
               "reference's layer output, the share of bits that differ from the canonical\n# "
               "output, the bits (prefill cases: the digest over every token)\n",
               r.problem.dtype == DType::bf16 ? "BF16" : "FP32");
  if (trainer) {
    std::fprintf(out, "%s\n",
                 trimmed("# " + padded("trainer case", 46) + " " + padded("canonical", 10) +
                         lanes_head(r.cases.front().layer.tp_lanes, 26))
                     .c_str());
    for (const CaseResult& c : r.cases)
      print_lane_row(out, c.name, c.layer.out.mean_abs, c.layer.tp_lanes, "out");
    const std::vector<TpLaneDrift>& first = r.cases.front().layer.tp_lanes;
    if (std::any_of(first.begin(), first.end(), [](const auto& l) { return l.tensor == "dx"; })) {
      std::fprintf(
          out,
          "# dX, the column-parallel backward's sum: mean |Δ| vs the reference's dX (canonical: "
          "the FP32 dX's), the share\n# of bits that differ from the canonical dX written "
          "in the same dtype\n");
      for (const CaseResult& c : r.cases)
        print_lane_row(out, c.name, dx_mean(c), c.layer.tp_lanes, "dx");
    }
  }
  if (trainer) print_gradient_lane_rows(out, r);
  if (rollout) {
    std::fprintf(
        out, "%s\n",
        trimmed("# " + padded("rollout case (decoded tokens)", 46) + " " + padded("canonical", 10) +
                lanes_head(r.paged_cases.front().layer_tp_lanes, 26))
            .c_str());
    for (const PagedCaseResult& c : r.paged_cases) {
      if (c.layer) print_lane_row(out, c.name, c.layer->mean_abs, c.layer_tp_lanes, "out");
    }
  }
}

void print_tp_lane_pairs(std::FILE* out, const RunReport& r) {
  std::vector<const RolloutPair*> pairs;
  for (const RolloutPair& p : r.rollout_pairs) {
    if (p.trainer_tp_reduction != "canonical" || p.rollout_tp_reduction != "canonical")
      pairs.push_back(&p);
  }
  if (pairs.empty()) return;
  std::fprintf(
      out,
      "#\n# trainer vs rollout through the stacks' TP sums: each trainer lane against each "
      "rollout lane at the %llu decoded tokens\n# (Δ = train - rollout; ρ = exp Δ; KL(rollout "
      "‖ train))\n",
      static_cast<unsigned long long>(pairs.front()->tokens));
  std::fprintf(out, "# %-40s %-12s %-44s %-8s %-9s %-9s %-8s %-8s %s\n", "trainer", "tp sum",
               "rollout", "tp sum", "layer", "|Δ| max", "ρ min", "ρ max", "exact KL");
  for (const RolloutPair* p : pairs) {
    std::fprintf(out, "  %-40s %-12s %-44s %-8s %-9s %-9.2e %-8.5f %-8.5f %.2e\n",
                 p->trainer.c_str(), p->trainer_tp_reduction.c_str(), p->rollout.c_str(),
                 p->rollout_tp_reduction.c_str(), p->layer ? sci(*p->layer).c_str() : "",
                 p->rl.abs_max, p->rl.ratio_min, p->rl.ratio_max, p->rl.kl_exact_mean);
  }
}

}  // namespace cpd
