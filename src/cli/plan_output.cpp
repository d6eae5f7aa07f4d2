// The plan's table and JSON, from each case's schedule and estimates.
#include <algorithm>
#include <cstring>

#include "cli/plan_estimate.h"

namespace cpd {
namespace {

// A forward phase's path: its name without the prefix all forward phases share.
std::string path_name(const Phase& ph) { return ph.name.substr(std::strlen(kForwardPhasePrefix)); }

double gflop(std::uint64_t pairs, double per_pair) {
  return static_cast<double>(pairs) * per_pair * 1e-9;
}

// Bytes rank r sends to and receives from other ranks in a phase (what crosses a link or a
// process; a rank's messages to itself are moves).
std::uint64_t sent_to_others(const PhaseWork& w, std::size_t r) {
  return w.sent[r].bytes - w.bytes_between[r * w.pairs.size() + r];
}
std::uint64_t received_from_others(const PhaseWork& w, std::size_t r) {
  return w.received[r].bytes - w.bytes_between[r * w.pairs.size() + r];
}

// The largest process's peak phase, its buffers largest first.
void print_memory(std::FILE* out, const std::vector<ProcessMemory>& memory) {
  std::size_t widest = 0;
  for (std::size_t i = 0; i < memory.size(); ++i) {
    if (memory[i].peak().bytes() > memory[widest].peak().bytes()) widest = i;
  }
  const PhaseMemory& peak = memory[widest].peak();
  std::vector<MemoryTerm> terms = peak.terms;
  std::sort(terms.begin(), terms.end(),
            [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes > b.bytes; });
  std::string list;
  for (const MemoryTerm& t : terms) {
    if (t.bytes < (std::uint64_t{1} << 20)) continue;
    char part[96];
    std::snprintf(part, sizeof part, "%s%s %.0f", list.empty() ? "" : ", ", t.name.c_str(),
                  static_cast<double>(t.bytes) * 1e-6);
    list += part;
  }
  std::fprintf(out, "  memory: peak %.0f MB (process %zu, %s): %s MB\n",
               static_cast<double>(peak.bytes()) * 1e-6, widest, peak.phase.c_str(), list.c_str());
}

// The largest of what rank r sends to and receives from other ranks in a forward pass and in the
// backward: one unit for the case's byte columns.
std::uint64_t largest_traffic(const CasePlan& c) {
  std::uint64_t largest = 0;
  for (const Phase* phase : {&c.forward(), c.schedule.find(PhaseKind::backward)}) {
    if (phase == nullptr) continue;
    for (std::size_t r = 0; r < phase->work.pairs.size(); ++r)
      largest =
          std::max({largest, sent_to_others(phase->work, r), received_from_others(phase->work, r)});
  }
  return largest;
}

// One row per logical rank: its tokens, forward and backward GFLOP and bytes, its process's peak.
void print_ranks(std::FILE* out, const CasePlan& c) {
  const CaseGrid& g = c.schedule.grid;
  const Phase& fwd = c.forward();
  const Phase* bwd = c.schedule.find(PhaseKind::backward);
  const bool giga = largest_traffic(c) >= 100'000'000'000ULL;
  const double unit = giga ? 1e-9 : 1e-6;
  const char* u = giga ? "GB" : "MB";
  std::fprintf(out, "  %5s %3s %3s %9s %10s %8s%s %8s%s %10s %8s%s %8s%s %9s\n", "rank", "tp", "cp",
               "tokens", "fwd GFLOP", "sent ", u, "recv ", u, "bwd GFLOP", "sent ", u, "recv ", u,
               "peak MB");
  const int processes = static_cast<int>(c.memory.size());
  const auto row = [&](const LogicalRank& r) {
    const std::size_t i = static_cast<std::size_t>(r.id);
    const auto columns = [&](const Phase& ph) {
      std::fprintf(out, " %10.1f %10.1f %10.1f", gflop(ph.work.pairs[i], ph.flops_per_pair),
                   static_cast<double>(sent_to_others(ph.work, i)) * unit,
                   static_cast<double>(received_from_others(ph.work, i)) * unit);
    };
    std::fprintf(out, "  %5d %3d %3d %9lld", r.id, r.tp_rank, r.cp_rank,
                 static_cast<long long>(total_size(r.tokens)));
    columns(fwd);
    if (bwd != nullptr) {
      columns(*bwd);
    } else {
      std::fprintf(out, " %10s %10s %10s", "-", "-", "-");
    }
    const ProcessMemory& m = c.memory[static_cast<std::size_t>(process_of(r.id, processes))];
    std::fprintf(out, " %9.0f\n", static_cast<double>(m.peak().bytes()) * 1e-6);
  };
  // Every rank up to 16; past that the first CP rank's TP group, "...", and the last rank.
  const bool all = g.ranks.size() <= 16;
  for (const LogicalRank& r : g.ranks) {
    if (all || r.cp_rank == 0) row(r);
  }
  if (!all) {
    std::fprintf(out, "  %5s\n", "...");
    row(g.ranks.back());
  }
  std::fprintf(out,
               "  (per forward pass; sent and received: to and from other ranks; peak: the "
               "resident memory of the rank's process, %d process%s)\n",
               processes, processes == 1 ? "" : "es");
}

// The estimate line: each forward path, the layer's o_proj, dlogp, the backward, the layer's
// backward, the CP=1 checks, the case.
void print_estimate(std::FILE* out, const CasePlan& c) {
  std::string forward;
  double checks = 0;
  for (const Phase& ph : c.schedule.phases) {
    const PhaseEstimate& e = c.estimate_of(&ph);
    if (ph.kind == PhaseKind::forward) {
      forward += std::string(forward.empty() ? "" : ", ") + path_name(ph) + " " +
                 (ph.host ? std::string("(host CPU, not costed)") : duration(e.total()));
    } else if (ph.kind == PhaseKind::reference_forward ||
               ph.kind == PhaseKind::reference_backward) {
      checks += e.total();
    }
  }
  const PhaseEstimate& pass = c.estimate_of(&c.forward());
  std::fprintf(out,
               "  estimate: forward %s (slowest process per FP32 pass: compute %s + messages %s)",
               forward.c_str(), duration(pass.compute).c_str(), duration(pass.comm).c_str());
  for (const PhaseKind kind :
       {PhaseKind::o_proj, PhaseKind::dlogp, PhaseKind::backward, PhaseKind::layer_backward}) {
    if (const Phase* ph = c.schedule.find(kind))
      std::fprintf(out, "; %s %s", ph->name.c_str(), duration(c.estimate_of(ph).total()).c_str());
  }
  if (checks > 0) std::fprintf(out, "; CP=1 checks at most %s", duration(checks).c_str());
  std::fprintf(out, "; case %s\n", duration(c.seconds).c_str());
}

json::Value traffic_json(const Traffic& t) {
  return json::Object{{"messages", t.messages}, {"bytes", t.bytes}};
}

json::Value phase_json(const Phase& phase, const PhaseEstimate& e) {
  const PhaseWork& w = phase.work;
  json::Array ranks;
  for (std::size_t r = 0; r < w.pairs.size(); ++r) {
    ranks.push_back(json::Object{{"rank", r},
                                 {"pairs", w.pairs[r]},
                                 {"flops", static_cast<double>(w.pairs[r]) * phase.flops_per_pair},
                                 {"sent", traffic_json(w.sent[r])},
                                 {"received", traffic_json(w.received[r])}});
  }
  return json::Object{{"ranks", std::move(ranks)},
                      {"total_pairs", w.total_pairs()},
                      {"total_sent", traffic_json(w.total_sent())},
                      {"estimated_seconds", e.total()},
                      {"estimated_compute_seconds", e.compute},
                      {"estimated_message_seconds", e.comm}};
}

json::Value memory_json(const std::vector<ProcessMemory>& memory) {
  json::Array all;
  for (std::size_t i = 0; i < memory.size(); ++i) {
    json::Array phases;
    for (const PhaseMemory& ph : memory[i].phases) {
      json::Object terms;
      for (const MemoryTerm& t : ph.terms) terms[t.name] = t.bytes;
      phases.push_back(
          json::Object{{"phase", ph.phase}, {"bytes", ph.bytes()}, {"terms", std::move(terms)}});
    }
    all.push_back(json::Object{{"process", i},
                               {"peak_bytes", memory[i].peak().bytes()},
                               {"peak_phase", memory[i].peak().phase},
                               {"phases", std::move(phases)}});
  }
  return all;
}

}  // namespace

void print_case(std::FILE* out, const Problem& p, const CasePlan& c, const Pick& pick) {
  const CaseGrid& g = c.schedule.grid;
  std::string paths;
  for (const Phase& ph : c.schedule.phases) {
    if (ph.kind == PhaseKind::forward) paths += (paths.empty() ? "" : ", ") + path_name(ph);
  }
  std::fprintf(out,
               "\n# case %s: %d rank%s, %zu KV blocks, %d forward round%s, %zu backward round%s; "
               "forward paths %s\n",
               case_name(c.spec(), p).c_str(), c.spec().num_logical_ranks(),
               c.spec().num_logical_ranks() == 1 ? "" : "s", g.blocks.size(), g.rounds(),
               g.rounds() == 1 ? "" : "s", g.backward_rounds().size(),
               g.backward_rounds().size() == 1 ? "" : "s", paths.c_str());
  print_ranks(out, c);
  print_memory(out, c.memory);
  print_estimate(out, c);
  std::fprintf(out, "  protocol: %s — %s\n", to_string(pick.protocol), pick.why.c_str());
}

json::Value case_json(const Problem& p, const CasePlan& c, const Pick& pick) {
  const CaseSchedule& s = c.schedule;
  json::Array paths;
  for (const Phase& ph : s.phases) {
    if (ph.kind == PhaseKind::forward)
      paths.push_back(
          json::Object{{"name", path_name(ph)}, {"estimated_seconds", c.estimate_of(&ph).total()}});
  }
  // The CP=1 checks' pairs per logical rank, at most: the reference forward's and backward's.
  const Phase* ref_forward = s.find(PhaseKind::reference_forward);
  const Phase* ref_backward = s.find(PhaseKind::reference_backward);
  json::Array reference;
  for (std::size_t r = 0; r < ref_forward->work.pairs.size(); ++r) {
    reference.push_back(
        json::Object{{"rank", r},
                     {"forward_pairs_at_most", ref_forward->work.pairs[r]},
                     {"backward_pairs_at_most", ref_backward ? ref_backward->work.pairs[r] : 0}});
  }
  // Every phase of the case as a run counts it (the report's bytes_moved).
  const Traffic all = s.traffic();
  json::Value v = json::Object{
      {"name", case_name(c.spec(), p)},
      {"tp", c.spec().tp},
      {"cp", c.spec().cp},
      {"protocol", to_string(c.spec().protocol)},
      {"layout", to_string(c.spec().layout)},
      {"kv_blocks", s.grid.blocks.size()},
      {"forward_rounds", s.grid.rounds()},
      {"backward_rounds", s.grid.backward_rounds().size()},
      {"forward_paths", std::move(paths)},
      {"forward_pass", phase_json(c.forward(), c.estimate_of(&c.forward()))},
      {"messages", all.messages},
      {"bytes_moved", all.bytes},
      {"estimated_seconds", c.seconds},
      {"cp1_checks", std::move(reference)},
      {"memory", memory_json(c.memory)},
      {"protocol_pick", json::Object{{"protocol", to_string(pick.protocol)}, {"why", pick.why}}}};
  for (const auto& [kind, key] :
       {std::pair{PhaseKind::backward, "backward"}, std::pair{PhaseKind::dlogp, "dlogp"}}) {
    if (const Phase* ph = s.find(kind)) v[key] = phase_json(*ph, c.estimate_of(ph));
  }
  return v;
}

}  // namespace cpd
