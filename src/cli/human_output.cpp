// Rank 0's human-readable table of a run (design §6).
#include <algorithm>

#include "cli/commands.h"
#include "cli/human_format.h"

namespace cpd {
namespace {

// "281-295 MB", "1.71-1.75 GB", "40 MB": the range of per-process byte counts, in the unit
// of the largest.
std::string memory_range(const std::vector<std::uint64_t>& bytes) {
  const auto [low, high] = std::minmax_element(bytes.begin(), bytes.end());
  const bool giga = *high >= 1'000'000'000;
  const double unit = giga ? 1e9 : 1e6;
  const char* format = giga ? "%.2f" : "%.0f";
  char lo[32], hi[32];
  std::snprintf(lo, sizeof lo, format, static_cast<double>(*low) / unit);
  std::snprintf(hi, sizeof hi, format, static_cast<double>(*high) / unit);
  return (std::string(lo) == hi ? std::string(hi) : std::string(lo) + "-" + hi) +
         (giga ? " GB" : " MB");
}

std::string topology_cell(const CaseResult& c) {
  const bool equal = c.topology.bitwise_equal();
  if (equal) return c.topology_required ? "bitwise" : "bitwise*";
  if (c.topology_required) return "FAILED";
  return "~" + sci(c.topology.out);
}

// The paged cases' section: a header, then one row per case.
void print_paged_rows(std::FILE* out, const RunReport& r) {
  if (r.paged_cases.empty()) return;
  const PagedWorkload& w = r.paged_cases.front().workload;
  std::string tp;  // the rollout's TP sizes, as the cases ran them
  for (const PagedCaseResult& c : r.paged_cases) {
    const std::string t = std::to_string(c.spec.tp);
    if (("," + tp + ",").find("," + t + ",") == std::string::npos)
      tp += (tp.empty() ? "" : ",") + t;
  }
  std::fprintf(
      out,
      "#\n# paged (rollout side, TP=%s): %d sequence%s, kv_len %lld..%lld, page %d, q_len %lld, "
      "shared prompt %lld tokens (%d page%s cached once)\n",
      tp.c_str(), w.sequences(), w.sequences() == 1 ? "" : "s",
      static_cast<long long>(w.kv_lens.front()), static_cast<long long>(w.kv_lens.back()),
      w.page_size, static_cast<long long>(w.q_len),
      static_cast<long long>(shared_prompt_len(r.problem)), w.prefix_pages(),
      w.prefix_pages() == 1 ? "" : "s");
  std::fprintf(out, "# %-52s %-19s %-9s %-19s %-22s %8s\n", "", "candidate vs fp32", "",
               "fp32 split/merge", "", "time");
  std::fprintf(out, "# %-52s %-9s %-9s %-9s %-9s %-9s %-22s %8s\n", "case", "out", "lse", "dlogp",
               "out", "lse", "invariances", "(s)");
  for (const PagedCaseResult& c : r.paged_cases) {
    int applicable = 0, equal = 0;
    std::string failed;  // the first applicable invariance whose bits differ
    for (const Invariance& inv : c.invariances) {
      applicable += inv.applicable ? 1 : 0;
      equal += inv.applicable && inv.bitwise_equal() ? 1 : 0;
      if (inv.applicable && !inv.bitwise_equal() && failed.empty()) failed = inv.name;
    }
    const std::string counts = std::to_string(equal) + "/" + std::to_string(applicable);
    const std::string cell = !invariances_required(c.spec) ? "diagnostic " + counts
                             : failed.empty()              ? counts + " bitwise"
                                                           : "FAILED " + failed;
    std::fprintf(out, "  %-52s %-9s %-9s %-9s %-9s %-9s %-22s %8.2f\n", c.name.c_str(),
                 sci(c.candidate.out).c_str(), sci(c.candidate.lse).c_str(), sci(c.dlogp).c_str(),
                 sci(c.fp32.out).c_str(), sci(c.fp32.lse).c_str(), cell.c_str(), c.seconds);
  }
}

// The dlogp leg's RL metrics, one row per case that ran it (nothing when none did).
void print_rl_rows(std::FILE* out, const RunReport& r) {
  bool any = false;
  for (const CaseResult& c : r.cases) any = any || (c.dlogp.available && c.dlogp.rl.tokens > 0);
  if (!any) return;
  std::fprintf(out,
               "#\n# each case's selected-token logprobs against its reference, the figures RL "
               "frameworks log (Δ = train - rollout:\n# the case's output as written vs the FP32 "
               "CP=1 reference cast alike; ρ = exp Δ; KL(rollout ‖ train))\n");
  // Δ and ρ take two bytes each, and printf pads bytes: their columns get one more.
  std::fprintf(out, "# %-46s %-10s %-10s %-10s %-9s %-9s %-9s %-9s %s\n", "case", "|Δ| mean",
               "|Δ| p99", "|Δ| max", "ρ min", "ρ max", "k3 KL", "exact KL", "first divergent");
  for (const CaseResult& c : r.cases) {
    if (!c.dlogp.available) continue;
    const RlMetrics& m = c.dlogp.rl;
    char first[64] = "none (bitwise)";
    if (m.diverged) {
      std::snprintf(first, sizeof first, "seq %d pos %lld", m.first_divergent.sequence,
                    static_cast<long long>(m.first_divergent.position));
    }
    std::fprintf(out, "  %-46s %-9.2e %-9.2e %-9.2e %-8.5f %-8.5f %-9.2e %-9.2e %s\n",
                 c.name.c_str(), m.abs_mean, m.abs_p99, m.abs_max, m.ratio_min, m.ratio_max,
                 m.k3_mean, m.kl_exact_mean, first);
  }
}

// The trainer-vs-rollout block: one line per (prefill case, paged case) pair.
void print_pair_rows(std::FILE* out, const RunReport& r) {
  if (r.rollout_pairs.empty()) return;
  std::fprintf(out,
               "#\n# trainer vs rollout: each prefill case against each paged case at the %llu "
               "decoded tokens (Δ = train - rollout)\n",
               static_cast<unsigned long long>(r.rollout_pairs.front().tokens));
  const bool layer = r.rollout_pairs.front().layer.has_value();
  std::fprintf(out, "# %-40s %-10s %-44s %-9s %-9s %-9s %-10s %-9s %s\n", "trainer", "merge",
               "rollout", "out", "lse", layer ? "layer" : "", "|Δ| max", "exact KL", "bits");
  for (const RolloutPair& p : r.rollout_pairs) {
    if (p.trainer_tp_reduction != "canonical" || p.rollout_tp_reduction != "canonical") continue;
    std::string bits;
    if (p.diagnostic) {
      bits = "diagnostic (split-KV auto)";
    } else if (p.trainer_merge != "canonical") {
      bits = p.bitwise_equal() ? "equal (the stack's merge)" : "drift (the stack's merge)";
    } else if (p.aligned) {
      bits = p.bitwise_equal() ? "bitwise (aligned)" : "FAILED: aligned, bits differ";
    } else {
      bits = p.bitwise_equal() ? "equal (not aligned)" : "drift (blocks differ)";
    }
    std::fprintf(out, "  %-40s %-10s %-44s %-9s %-9s %-9s %-9.2e %-9.2e %s\n", p.trainer.c_str(),
                 p.trainer_merge.c_str(), p.rollout.c_str(), sci(p.out).c_str(), sci(p.lse).c_str(),
                 p.layer ? sci(*p.layer).c_str() : "", p.rl.abs_max, p.rl.kl_exact_mean,
                 bits.c_str());
  }
}

// The te_p2p lane's backward (--include-lane-backward), beside the canonical gradients' BF16
// write: max |Δ| vs the FP32 CP=1 reference and the share of bits that differ from canonical.
void print_lane_backward_rows(std::FILE* out, const RunReport& r) {
  if (r.cases.empty() || !r.cases.front().backward.te_p2p) return;
  std::fprintf(out,
               "#\n# te_p2p backward, emulated: max |Δ| vs FP32 CP=1 of the canonical BF16 write "
               "and the lane (its gradients written\n# and summed in BF16 across ring steps; the "
               "share of bits that differ from the canonical write)\n");
  std::fprintf(out, "# %-46s %-28s %-28s %s\n", "case", "dq canon  te_p2p", "dk canon  te_p2p",
               "dv canon  te_p2p");
  for (const CaseResult& c : r.cases) {
    if (!c.backward.te_p2p) continue;
    const BackwardDrift& b = c.backward;
    const BackwardDrift::Lane& l = *b.te_p2p;
    std::string row = "  " + padded(c.name, 46);
    // Per gradient: the canonical BF16 write, the lane's, and the lane against canonical.
    const DiffStats* grads[][3] = {{&b.bf16_dq, &l.dq, &l.canonical_dq},
                                   {&b.bf16_dk, &l.dk, &l.canonical_dk},
                                   {&b.bf16_dv, &l.dv, &l.canonical_dv}};
    for (const auto& g : grads) {
      char cell[64];
      std::snprintf(cell, sizeof cell, " %-9.3e %-9.3e %-7s", g[0]->max_abs, g[1]->max_abs,
                    differing(*g[2]).c_str());
      row += cell;
    }
    std::fprintf(out, "%s\n", trimmed(row).c_str());
  }
}

// The production lanes' block: per prefill case, each lane's drift and its bits vs canonical.
void print_lane_rows(std::FILE* out, const RunReport& r) {
  if (r.cases.empty() || r.cases.front().lanes.empty()) return;
  std::fprintf(out,
               "#\n# production stacks, emulated: the BF16-kernel states merged as each stack "
               "does (mean |Δout| vs FP32 CP=1;\n# the share of output bits that differ from "
               "the canonical grid's merge of the same states)\n");
  std::string head = "# " + padded("case", 46) + " " + padded("canonical", 10);
  for (const LaneDrift& l : r.cases.front().lanes) head += " " + padded(to_string(l.lane), 19);
  std::fprintf(out, "%s\n", trimmed(head).c_str());
  for (const CaseResult& c : r.cases) {
    char cell[64];
    std::snprintf(cell, sizeof cell, "%-10.3e", c.bf16_kernel.out.mean_abs);
    std::string row = "  " + padded(c.name, 46) + " " + cell;
    for (const LaneDrift& l : c.lanes) {
      const bool same = l.vs_canonical.bitwise_equal();
      std::snprintf(cell, sizeof cell, " %-9.3e %-9s", l.vs_reference.out.mean_abs,
                    same ? "= canon" : differing(l.vs_canonical.out).c_str());
      row += cell;
    }
    std::fprintf(out, "%s\n", trimmed(row).c_str());
  }
  print_lane_backward_rows(out, r);
}

// The layer's output per case (--scope layer): its drift, and its bits' digest, so that the cases
// of one block grid show the same bits whatever their TP and CP.
void print_layer_rows(std::FILE* out, const RunReport& r) {
  if (r.cases.empty() || !r.cases.front().layer.available) return;
  std::fprintf(out,
               "#\n# the attention layer (hidden → q/k/v_proj → norms → RoPE → attention → o_proj, "
               "o_proj order %s):\n# its output vs the FP32 CP=1 reference's through the same "
               "o_proj, and its bits (digest)\n",
               to_string(r.problem.o_proj_order));
  std::fprintf(out, "# %-46s %-11s %-11s %s\n", "case", "max |Δ|", "mean |Δ|",
               "bits");  // Δ: 2 bytes
  for (const CaseResult& c : r.cases) {
    const DiffStats& s = c.layer.out;
    std::fprintf(out, "  %-46s %-9s %-9.2e %s\n", c.name.c_str(), sci(s).c_str(), s.mean_abs,
                 s.digest ? s.digest->substr(0, 16).c_str() : "-");
  }
}

// The layer's gradients per case (--scope layer --include-backward): dX's drift, the largest
// drift among the weights' gradients and which, and one digest of all of their digests, so that
// the cases of one block grid show the same bits whatever their TP and CP.
void print_layer_backward_rows(std::FILE* out, const RunReport& r) {
  if (r.cases.empty() || r.cases.front().layer.backward.empty()) return;
  std::fprintf(out,
               "#\n# the layer's backward (dX and every weight's gradient) vs the same arithmetic "
               "from the CP=1 reference backward's gradients,\n# and the bits of all of them "
               "(one digest of their digests)\n");
  std::fprintf(out, "# %-46s %-11s %-23s %s\n", "case", "dX max |Δ|", "weights: max |Δ|",
               "bits");  // Δ: 2 bytes each
  for (const CaseResult& c : r.cases) {
    std::string dx = "-", worst = "-";
    double largest = -1;
    std::uint64_t h = 1469598103934665603ULL;  // FNV-1a over the digests, in report order
    for (const auto& [name, s] : c.layer.backward) {
      if (name == "dx") {
        dx = sci(s);
      } else if (s.max_abs > largest) {
        largest = s.max_abs;
        worst = sci(s) + (s.max_abs > 0 ? " " + name : "");
      }
      for (const char ch : s.digest.value_or("-"))
        h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ULL;
    }
    std::fprintf(out, "  %-46s %-10s %-22s %016llx\n", c.name.c_str(), dx.c_str(), worst.c_str(),
                 static_cast<unsigned long long>(h));
  }
}

}  // namespace

void print_header(std::FILE* out, const RunReport& r, std::size_t case_count,
                  std::size_t paged_count) {
  const Provenance& pv = r.provenance;
  const Problem& p = r.problem;
  std::fprintf(out, "# cpdrift %s: CP attention drift, %s (%s)\n", pv.git_describe.c_str(),
               p.dims.name.c_str(), kReportSchema);
  std::string inputs = std::string(to_string(p.distribution)) + " inputs";
  if (p.inputs) {
    const InputFileInfo& f = p.inputs->info();
    inputs = "inputs " + f.path + " (" + f.format + " " + f.dtype + ", " +
             (f.hidden         ? "the layer's hidden states"
              : f.rope_applied ? "after RoPE"
                               : "RoPE applied here") +
             ", sha256 " + f.sha256.substr(0, 12) + ")";
  }
  const std::string rope = p.rope ? "RoPE " + rope_text(p.dims.rope) : "no RoPE";
  std::string extras;
  if (p.dims.qkv_bias) extras += ", qkv bias";
  std::fprintf(out,
               "# target  : B=%d S=%lld Hq=%d Hkv=%d D=%d causal, %s%s, dtype %s, seed %llu, %s\n",
               p.batch, static_cast<long long>(p.seq_len), p.dims.num_q_heads, p.dims.num_kv_heads,
               p.dims.head_dim, rope.c_str(), extras.c_str(), to_string(p.dtype),
               static_cast<unsigned long long>(p.seed), inputs.c_str());
  std::fprintf(out, "# model   : %s\n", p.dims.source.c_str());
  std::fprintf(
      out, "# launch  : %d process%s (%s), device %s, transport %s, %d thread%s/process (%s)\n",
      pv.world_size, pv.world_size == 1 ? "" : "es", pv.launcher.c_str(), pv.device.c_str(),
      pv.transport.c_str(), pv.threads, pv.threads == 1 ? "" : "s", pv.simd.c_str());
  std::fprintf(out, "# build   : %s, %s%s%s%s%s%s%s\n", pv.compiler.c_str(), pv.mpi_version.c_str(),
               pv.hdf5_version.empty() ? "" : ", HDF5 ", pv.hdf5_version.c_str(),
               pv.cuda_version.empty() ? "" : ", CUDA ", pv.cuda_version.c_str(),
               pv.nccl_version.empty() ? "" : ", NCCL ", pv.nccl_version.c_str());
  if (paged_count > 0)
    std::fprintf(out, "# paged   : %zu case%s (the rollout side)\n", paged_count,
                 paged_count == 1 ? "" : "s");
  if (case_count == 0) return;
  std::fprintf(out,
               "# cases   : %zu (max |diff| vs the FP32 CP=1 reference; topology vs CP=1 with the "
               "same split)\n",
               case_count);
  std::fprintf(out, "#\n");
  std::fprintf(out, "# %-46s %-19s %-19s %-19s %-10s %-6s %-9s %-9s %8s\n", "", "cp_merge_fp32",
               "dtype_path_vs_fp32", "bf16_kernel", "topology", "probe", "backward", "dlogp",
               "time");
  std::fprintf(out, "# %-46s %-9s %-9s %-9s %-9s %-9s %-9s %-10s %-6s %-9s %-9s %8s\n", "case",
               "out", "lse", "out", "lse", "out", "lse", "", "", "dq/dk/dv", "", "(s)");
}

void print_case_row(std::FILE* out, const CaseResult& c) {
  const bool probe_ok = c.merge_probe.bitwise_equal();
  // The largest of the three gradient drifts, or "-" when the leg did not run.
  std::string grads = "-";
  if (c.backward.available) {
    const DiffStats* worst = &c.backward.dq;
    for (const DiffStats* s : {&c.backward.dk, &c.backward.dv}) {
      if (!s->finite() || (worst->finite() && s->max_abs > worst->max_abs)) worst = s;
    }
    grads = sci(*worst);
  }
  const std::string dlogp = c.dlogp.available ? sci(c.dlogp.drift) : "-";
  std::fprintf(out, "  %-46s %-9s %-9s %-9s %-9s %-9s %-9s %-10s %-6s %-9s %-9s %8.2f\n",
               c.name.c_str(), sci(c.cp_merge_fp32.out).c_str(), sci(c.cp_merge_fp32.lse).c_str(),
               sci(c.dtype_path.out).c_str(), sci(c.dtype_path.lse).c_str(),
               sci(c.bf16_kernel.out).c_str(), sci(c.bf16_kernel.lse).c_str(),
               topology_cell(c).c_str(), probe_ok ? "0" : "FAILED", grads.c_str(), dlogp.c_str(),
               c.seconds);
  std::fflush(out);
}

void print_footer(std::FILE* out, const RunReport& r) {
  print_layer_rows(out, r);
  print_layer_backward_rows(out, r);
  print_rl_rows(out, r);
  print_lane_rows(out, r);
  print_paged_rows(out, r);
  print_pair_rows(out, r);
  print_tp_lane_rows(out, r);
  print_tp_lane_pairs(out, r);
  std::fprintf(out, "#\n");
  if (!r.cases.empty()) {
    std::fprintf(
        out, "# topology: bitwise = required and equal; bitwise* = equal though not required;\n");
    std::fprintf(out, "#           ~x = drift x reported (the block grid differs from CP=1's)\n");
  }
  if (!r.paged_cases.empty()) {
    std::fprintf(out,
                 "# paged: candidate = the rollout lane as written vs FP32 on the same inputs; "
                 "invariances\n");
    std::fprintf(
        out, "#        = batch, page layout, prefix cache, decode vs prefill, query position x2\n");
  }
  for (const std::string& f : r.failed_checks) std::fprintf(out, "# FAILED: %s\n", f.c_str());
  std::fprintf(out, "# Wall time : %.2f s\n", r.wall_seconds);
  if (!r.peak_rss_bytes.empty()) {
    std::fprintf(out, "# Peak memory : %s resident per process (%zu process%s)\n",
                 memory_range(r.peak_rss_bytes).c_str(), r.peak_rss_bytes.size(),
                 r.peak_rss_bytes.size() == 1 ? "" : "es");
  }
  std::fprintf(out, "# Drift check : %s\n", r.passed() ? "OK" : "FAILED");
  std::fflush(out);
}

}  // namespace cpd
