// The human table's TP-reduction lanes (--scope layer, numerics.md §12): each case's layer output
// through the stacks' sums over TP ranks, and the trainer-vs-rollout pairs through them.
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
  for (const TpLaneDrift& l : lanes) head += " " + padded(to_string(l.lane), width);
  return head;
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
    for (const CaseResult& c : r.cases) {
      char cell[32];
      std::snprintf(cell, sizeof cell, "%-10.3e", c.layer.out.mean_abs);
      std::string row = "  " + padded(c.name, 46) + " " + cell;
      for (const TpLaneDrift& l : c.layer.tp_lanes) row += lane_cell(l);
      std::fprintf(out, "%s\n", trimmed(row).c_str());
    }
  }
  if (rollout) {
    std::fprintf(out, "%s\n",
                 trimmed("# " + padded("rollout case (decoded tokens)", 46) + " " +
                         padded("canonical", 10) +
                         lanes_head(r.paged_cases.front().layer_tp_lanes, 26))
                     .c_str());
    for (const PagedCaseResult& c : r.paged_cases) {
      if (!c.layer) continue;
      char cell[32];
      std::snprintf(cell, sizeof cell, "%-10.3e", c.layer->mean_abs);
      std::string row = "  " + padded(c.name, 46) + " " + cell;
      for (const TpLaneDrift& l : c.layer_tp_lanes) row += lane_cell(l);
      std::fprintf(out, "%s\n", trimmed(row).c_str());
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
  std::fprintf(out,
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
