// `cpdrift plan`: what a run would cost, per case and logical rank, before it runs: the
// kernels' FLOPs and every phase's bytes (exactly what the run counts: engine/work_plan.h), the
// time that comes to on a machine's figures, and the protocol that would be quickest.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "cli/commands.h"
#include "cli/kernel_timing.h"
#include "core/errors.h"
#include "engine/memory_plan.h"
#include "engine/work_plan.h"
#include "report/json.h"

namespace cpd {
namespace {

// The machine the estimates are for. Link figures are per direction and per GPU (process).
struct Profile {
  std::string name;
  double bf16_flops = 0, fp32_flops = 0, fp32_backward_flops = 0;  // FLOP/s of one process
  double hbm = 0, nvlink = 0, network = 0;                         // bytes/s
  int processes_per_node = 8;
  std::string source;  // where the figures come from
};

// The CPU profile: this machine's forward and backward kernels and its memcpy, measured now
// over every core, shared evenly by `processes` processes on the node.
Profile measure_cpu(int processes) {
  using namespace kernel_timing;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(cores);
  Problem p;
  p.seq_len = 2048;
  const Inputs in = make_inputs(p, InputPrecision::fp32, pool);
  AttnShard out;
  const std::vector<double> fwd = times_of(3, [&] {
    double s = 0;
    out = forward(p, in, ProbRounding::none, pool, s);
    return s;
  });
  const std::vector<double> bwd = time_backward(p, in, out, 2, pool);
  std::vector<char> a(std::size_t{256} << 20, 1), b(a.size(), 0);
  const std::vector<double> copy = times_of(3, [&] {
    const auto t = Clock::now();
    std::memcpy(b.data(), a.data(), a.size());
    return seconds_since(t);
  });
  Profile cpu;
  cpu.name = "cpu";
  const double share = 1.0 / processes;
  cpu.fp32_flops = forward_flops(p) / fwd.front() * share;
  cpu.bf16_flops = cpu.fp32_flops;  // emulated BF16 runs the FP32 kernels
  cpu.fp32_backward_flops = 2.5 * forward_flops(p) / bwd.front() * share;
  // A message between processes is copied into shared memory and out again.
  cpu.hbm = static_cast<double>(a.size()) / copy.front();
  cpu.nvlink = cpu.network = cpu.hbm / 2;
  cpu.processes_per_node = processes;
  char text[160];
  std::snprintf(text, sizeof text,
                "measured now: forward %.0f GFLOP/s, backward %.0f GFLOP/s, memcpy %.1f GB/s on "
                "%d core%s, shared by %d process%s",
                forward_flops(p) / fwd.front() * 1e-9, 2.5 * forward_flops(p) / bwd.front() * 1e-9,
                cpu.hbm * 1e-9, cores, cores == 1 ? "" : "s", processes,
                processes == 1 ? "" : "es");
  cpu.source = text;
  return cpu;
}

Profile device_profile(const PlanOptions& o) {
  Profile d;
  d.name = o.profile;
  d.bf16_flops = o.bf16_tflops * 1e12;
  d.fp32_flops = d.fp32_backward_flops = o.fp32_tflops * 1e12;
  d.hbm = o.hbm_tbs * 1e12;
  d.nvlink = o.nvlink_gbs * 1e9;
  d.network = o.network_gbs * 1e9;
  d.processes_per_node = o.gpus_per_node;
  d.source =
      "device figures (override with --bf16-tflops, --fp32-tflops, --hbm-tbs, "
      "--nvlink-gbs, --network-gbs, --gpus-per-node)";
  return d;
}

struct PhaseEstimate {
  double compute = 0, comm = 0;  // of the slowest process
  double total() const { return compute + comm; }
};

// Per logical rank, its kernels' seconds: `pairs` at `flops_per_pair` and `rate`.
std::vector<double> kernel_seconds(const std::vector<std::uint64_t>& pairs, double flops_per_pair,
                                   double rate) {
  std::vector<double> s;
  for (const std::uint64_t n : pairs) s.push_back(static_cast<double>(n) * flops_per_pair / rate);
  return s;
}

// The slowest process of a phase: its kernels (`kernels`, per logical rank) and its messages
// through memory, then its messages over the links (no overlap: the exchanges are supersteps),
// the larger of what it sends and what it receives. A message to a logical rank on the same
// process is a move.
PhaseEstimate estimate(const PhaseWork& w, const std::vector<double>& kernels, const Profile& pf,
                       int processes) {
  const std::size_t ranks = w.pairs.size();
  std::vector<double> compute(static_cast<std::size_t>(processes), 0.0), send(compute),
      recv(compute);
  const auto proc = [&](std::size_t r) {
    return static_cast<std::size_t>(process_of(static_cast<int>(r), processes));
  };
  // Its kernels, and every message it receives written and read once through memory (the
  // partial states a merge reads back, the rows a kernel reads).
  for (std::size_t r = 0; r < ranks; ++r) {
    compute[proc(r)] += kernels[r] + 2.0 * static_cast<double>(w.received[r].bytes) / pf.hbm;
  }
  for (std::size_t s = 0; s < ranks; ++s) {
    for (std::size_t d = 0; d < ranks; ++d) {
      const double bytes = static_cast<double>(w.bytes_between[s * ranks + d]);
      if (bytes == 0 || proc(s) == proc(d)) continue;
      const bool same_node = static_cast<int>(proc(s)) / pf.processes_per_node ==
                             static_cast<int>(proc(d)) / pf.processes_per_node;
      const double seconds = bytes / (same_node ? pf.nvlink : pf.network);
      send[proc(s)] += seconds;
      recv[proc(d)] += seconds;
    }
  }
  PhaseEstimate worst;
  for (std::size_t p = 0; p < compute.size(); ++p) {
    const PhaseEstimate e{compute[p], std::max(send[p], recv[p])};
    if (e.total() > worst.total()) worst = e;
  }
  return worst;
}

struct CasePlan {
  CasePlan(const CaseSpec& s, const CaseGrid& g, CaseWork w, std::vector<ForwardPath> f)
      : spec(s), grid(g), work(std::move(w)), paths(std::move(f)) {}
  CaseSpec spec;
  CaseGrid grid;
  CaseWork work;
  std::vector<ForwardPath> paths;
  std::vector<PhaseEstimate> forward;  // per path
  PhaseEstimate backward, dlogp, reference;
  double seconds = 0;
  std::vector<ProcessMemory> memory;  // per process of the run

  double forward_seconds() const {
    double s = 0;
    for (const PhaseEstimate& e : forward) s += e.total();
    return s;
  }
};

// Whether the planned run is a CUDA one (its forward paths, so its bytes): as --device says,
// else as the profile's machine is.
bool gpu_run(const RunRequest& q, const Profile& pf) {
  return q.device == Device::cuda || (q.device == Device::auto_select && pf.name != "cpu");
}

CasePlan plan_case(const Problem& p, const RunRequest& q, const CaseSpec& spec, const Profile& pf,
                   int processes) {
  const CaseGrid grid(p, spec, q.round_rows);
  CasePlan c(spec, grid,
             plan_case_work(grid, q.include_backward, q.include_dlogp ? q.vocab_size : 0),
             forward_paths(p.dtype, gpu_run(q, pf), gpu_run(q, pf) && q.cpu_check));
  const int dim = p.dims.head_dim;
  const int world = std::min(processes, spec.num_logical_ranks());
  for (const ForwardPath& path : c.paths) {
    // The host's re-run is not costed: the profile describes the device.
    const double rate = path.bf16_rate ? pf.bf16_flops : pf.fp32_flops;
    c.forward.push_back(path.host ? PhaseEstimate{}
                                  : estimate(c.work.forward,
                                             kernel_seconds(c.work.forward.pairs, 4.0 * dim, rate),
                                             pf, world));
  }
  if (q.include_backward) {
    c.backward = estimate(c.work.backward,
                          kernel_seconds(c.work.backward.pairs, 10.0 * dim, pf.fp32_backward_flops),
                          pf, world);
  }
  if (q.include_dlogp)
    c.dlogp =
        estimate(c.work.dlogp, std::vector<double>(c.work.dlogp.pairs.size(), 0.0), pf, world);
  c.seconds = c.forward_seconds() + c.backward.total() + c.dlogp.total();
  if (pf.name == "cpu") {
    // This tool's CP=1 checks run beside the case on the CPU, a phase of their own with no
    // messages costed: the reference forwards, and the CP=1 backward (from the reference
    // forward's rows, gathered by KV head).
    std::vector<double> s =
        kernel_seconds(c.work.reference_forward_pairs, 4.0 * dim, pf.fp32_flops);
    for (std::size_t r = 0; r < s.size(); ++r) {
      s[r] += static_cast<double>(c.work.reference_backward_pairs[r]) * 10.0 * dim /
              pf.fp32_backward_flops;
    }
    c.reference = estimate(PhaseWork(spec.num_logical_ranks()), s, pf, world);
    c.seconds += c.reference.total();
  }
  return c;
}

double gflop(std::uint64_t pairs, double per_pair) {
  return static_cast<double>(pairs) * per_pair * 1e-9;
}

// "1.23 s", "45.6 ms" or "789 us".
std::string duration(double s) {
  char text[32];
  if (s >= 1) {
    std::snprintf(text, sizeof text, "%.2f s", s);
  } else if (s >= 1e-3) {
    std::snprintf(text, sizeof text, "%.2f ms", s * 1e3);
  } else {
    std::snprintf(text, sizeof text, "%.0f us", s * 1e6);
  }
  return text;
}

// The protocol with the lowest estimated forward, and one line saying why.
struct Pick {
  Protocol protocol;
  std::string why;
};

Pick pick_protocol(const Problem& p, const RunRequest& q, const CasePlan& planned,
                   const Profile& pf, int processes) {
  // The others' forward only (the backward and dlogp do not depend on the protocol).
  Pick best{planned.spec.protocol, ""};
  if (planned.spec.cp == 1) {  // no CP exchange: the protocols are the same work
    best.why = "CP=1: no partial state crosses a CP rank, so every protocol is the same work";
    return best;
  }
  RunRequest forward_only = q;
  forward_only.include_backward = forward_only.include_dlogp = false;
  double best_s = -1;
  std::uint64_t best_bytes = 0;
  std::string why;
  for (const Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv}) {
    CaseSpec s = planned.spec;
    s.protocol = protocol;
    std::optional<CasePlan> other;
    if (protocol != planned.spec.protocol) other = plan_case(p, forward_only, s, pf, processes);
    const CasePlan& c = other ? *other : planned;
    const double t = c.forward[0].total();
    const std::uint64_t bytes = c.work.forward.total_sent().bytes;
    char part[128];
    std::snprintf(part, sizeof part, "%s%s %s (%.3g GB moved)", why.empty() ? "" : ", ",
                  to_string(protocol), duration(t).c_str(), static_cast<double>(bytes) * 1e-9);
    why += part;
    if (best_s < 0 || t < best_s * (1 - 1e-9) || (t <= best_s * (1 + 1e-9) && bytes < best_bytes)) {
      best_s = t;
      best_bytes = bytes;
      best.protocol = protocol;
    }
  }
  best.why = "the quickest FP32 forward pass: " + why + "; all three give the same bits";
  return best;
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

void print_case(std::FILE* out, const Problem& p, const CasePlan& c, const Pick& pick) {
  const CaseGrid& g = c.grid;
  const int dim = p.dims.head_dim;
  const bool bwd = !c.work.backward.pairs.empty();
  std::string paths;
  for (const ForwardPath& f : c.paths) paths += std::string(paths.empty() ? "" : ", ") + f.name;
  std::fprintf(out,
               "\n# case %s: %d rank%s, %zu KV blocks, %d forward round%s, %zu backward round%s; "
               "forward paths %s\n",
               case_name(c.spec, p.dtype).c_str(), c.spec.num_logical_ranks(),
               c.spec.num_logical_ranks() == 1 ? "" : "s", g.blocks.size(), g.rounds(),
               g.rounds() == 1 ? "" : "s", g.backward_rounds().size(),
               g.backward_rounds().size() == 1 ? "" : "s", paths.c_str());
  // One unit for the case's byte columns: MB, or GB when a column would pass 10^5 MB.
  std::uint64_t largest = 0;
  for (std::size_t r = 0; r < g.ranks.size(); ++r) {
    largest = std::max(
        {largest, sent_to_others(c.work.forward, r), received_from_others(c.work.forward, r)});
    if (bwd) {
      largest = std::max(
          {largest, sent_to_others(c.work.backward, r), received_from_others(c.work.backward, r)});
    }
  }
  const bool giga = largest >= 100'000'000'000ULL;
  const double unit = giga ? 1e-9 : 1e-6;
  const char* u = giga ? "GB" : "MB";
  std::fprintf(out, "  %5s %3s %3s %9s %10s %8s%s %8s%s %10s %8s%s %8s%s %9s\n", "rank", "tp", "cp",
               "tokens", "fwd GFLOP", "sent ", u, "recv ", u, "bwd GFLOP", "sent ", u, "recv ", u,
               "peak MB");
  const int processes = static_cast<int>(c.memory.size());
  const auto peak_mb = [&](const LogicalRank& r) {
    return static_cast<double>(
               c.memory[static_cast<std::size_t>(process_of(r.id, processes))].peak().bytes()) *
           1e-6;
  };
  const auto row = [&](const LogicalRank& r) {
    const std::size_t i = static_cast<std::size_t>(r.id);
    std::fprintf(out, "  %5d %3d %3d %9lld %10.1f %10.1f %10.1f", r.id, r.tp_rank, r.cp_rank,
                 static_cast<long long>(total_size(r.tokens)),
                 gflop(c.work.forward.pairs[i], 4.0 * dim),
                 static_cast<double>(sent_to_others(c.work.forward, i)) * unit,
                 static_cast<double>(received_from_others(c.work.forward, i)) * unit);
    if (bwd) {
      std::fprintf(out, " %10.1f %10.1f %10.1f", gflop(c.work.backward.pairs[i], 10.0 * dim),
                   static_cast<double>(sent_to_others(c.work.backward, i)) * unit,
                   static_cast<double>(received_from_others(c.work.backward, i)) * unit);
    } else {
      std::fprintf(out, " %10s %10s %10s", "-", "-", "-");
    }
    std::fprintf(out, " %9.0f\n", peak_mb(r));
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
  print_memory(out, c.memory);
  std::string forward;
  for (std::size_t i = 0; i < c.paths.size(); ++i) {
    forward +=
        std::string(i == 0 ? "" : ", ") + c.paths[i].name + " " +
        (c.paths[i].host ? std::string("(host CPU, not costed)") : duration(c.forward[i].total()));
  }
  std::fprintf(
      out, "  estimate: forward %s (slowest process per FP32 pass: compute %s + messages %s)",
      forward.c_str(), duration(c.forward[0].compute).c_str(), duration(c.forward[0].comm).c_str());
  if (bwd) std::fprintf(out, "; backward %s", duration(c.backward.total()).c_str());
  if (!c.work.dlogp.pairs.empty())
    std::fprintf(out, "; dlogp %s", duration(c.dlogp.total()).c_str());
  if (c.reference.total() > 0)
    std::fprintf(out, "; CP=1 checks at most %s", duration(c.reference.total()).c_str());
  std::fprintf(out, "; case %s\n", duration(c.seconds).c_str());
  std::fprintf(out, "  protocol: %s — %s\n", to_string(pick.protocol), pick.why.c_str());
}

json::Value traffic_json(const Traffic& t) {
  json::Value v = json::Value::object();
  v["messages"] = t.messages;
  v["bytes"] = t.bytes;
  return v;
}

json::Value phase_json(const PhaseWork& w, double flops_per_pair, const PhaseEstimate& e) {
  json::Value v = json::Value::object();
  json::Value ranks = json::Value::array();
  for (std::size_t r = 0; r < w.pairs.size(); ++r) {
    json::Value x = json::Value::object();
    x["rank"] = r;
    x["pairs"] = w.pairs[r];
    x["flops"] = static_cast<double>(w.pairs[r]) * flops_per_pair;
    x["sent"] = traffic_json(w.sent[r]);
    x["received"] = traffic_json(w.received[r]);
    ranks.push_back(std::move(x));
  }
  v["ranks"] = std::move(ranks);
  v["total_pairs"] = w.total_pairs();
  v["total_sent"] = traffic_json(w.total_sent());
  v["estimated_seconds"] = e.total();
  v["estimated_compute_seconds"] = e.compute;
  v["estimated_message_seconds"] = e.comm;
  return v;
}

json::Value case_json(const Problem& p, const CasePlan& c, const Pick& pick) {
  const int dim = p.dims.head_dim;
  json::Value v = json::Value::object();
  v["name"] = case_name(c.spec, p.dtype);
  v["tp"] = c.spec.tp;
  v["cp"] = c.spec.cp;
  v["protocol"] = to_string(c.spec.protocol);
  v["layout"] = to_string(c.spec.layout);
  v["kv_blocks"] = c.grid.blocks.size();
  v["forward_rounds"] = c.grid.rounds();
  v["backward_rounds"] = c.grid.backward_rounds().size();
  json::Value paths = json::Value::array();
  for (std::size_t i = 0; i < c.paths.size(); ++i) {
    json::Value x = json::Value::object();
    x["name"] = c.paths[i].name;
    x["estimated_seconds"] = c.forward[i].total();
    paths.push_back(std::move(x));
  }
  v["forward_paths"] = std::move(paths);
  v["forward_pass"] = phase_json(c.work.forward, 4.0 * dim, c.forward[0]);
  if (!c.work.backward.pairs.empty())
    v["backward"] = phase_json(c.work.backward, 10.0 * dim, c.backward);
  if (!c.work.dlogp.pairs.empty()) v["dlogp"] = phase_json(c.work.dlogp, 0, c.dlogp);
  // Every phase of the case as a run counts it (the report's bytes_moved).
  Traffic all;
  for (std::size_t i = 0; i < c.paths.size(); ++i) all += c.work.forward.total_sent();
  if (!c.work.backward.pairs.empty()) all += c.work.backward.total_sent();
  if (!c.work.dlogp.pairs.empty()) all += c.work.dlogp.total_sent();
  v["messages"] = all.messages;
  v["bytes_moved"] = all.bytes;
  v["estimated_seconds"] = c.seconds;
  json::Value reference = json::Value::array();
  for (std::size_t r = 0; r < c.work.reference_forward_pairs.size(); ++r) {
    json::Value x = json::Value::object();
    x["rank"] = r;
    x["forward_pairs_at_most"] = c.work.reference_forward_pairs[r];
    x["backward_pairs_at_most"] = c.work.reference_backward_pairs[r];
    reference.push_back(std::move(x));
  }
  v["cp1_checks"] = std::move(reference);
  json::Value memory = json::Value::array();
  for (std::size_t i = 0; i < c.memory.size(); ++i) {
    json::Value x = json::Value::object();
    x["process"] = i;
    x["peak_bytes"] = c.memory[i].peak().bytes();
    x["peak_phase"] = c.memory[i].peak().phase;
    json::Value phases = json::Value::array();
    for (const PhaseMemory& ph : c.memory[i].phases) {
      json::Value y = json::Value::object();
      y["phase"] = ph.phase;
      y["bytes"] = ph.bytes();
      json::Value terms = json::Value::object();
      for (const MemoryTerm& t : ph.terms) terms[t.name] = t.bytes;
      y["terms"] = std::move(terms);
      phases.push_back(std::move(y));
    }
    x["phases"] = std::move(phases);
    memory.push_back(std::move(x));
  }
  v["memory"] = std::move(memory);
  json::Value best = json::Value::object();
  best["protocol"] = to_string(pick.protocol);
  best["why"] = pick.why;
  v["protocol_pick"] = std::move(best);
  return v;
}

// The plan counts pairs in 64-bit integers: refuse a problem whose pair count could not be
// held (S²·B·Hq/2 ≥ 2^63, past S ≈ 5·10^8 for Qwen3), rather than print a wrapped number.
void check_countable(const RunRequest& q, const RunPlan& run) {
  if (run.cases.empty()) return;
  const double pairs = static_cast<double>(q.problem.seq_len) *
                       static_cast<double>(q.problem.seq_len) * q.problem.batch *
                       q.problem.dims.num_q_heads / 2;
  if (pairs >= 9.2e18) {
    throw UsageError("plan: --seq-len " + std::to_string(q.problem.seq_len) + " with --batch " +
                     std::to_string(q.problem.batch) +
                     " has more (row, key) pairs than the plan counts (2^63)");
  }
}

}  // namespace

int plan_command(const PlanOptions& o, const CommContext& comm) {
  const RunRequest& q = o.run.request;
  const RunPlan run = plan_run(q);
  check_output_path(o.run.output, comm);
  check_countable(q, run);
  if (o.profile == "cpu" && comm.size() > 1) {
    // The other processes would idle in MPI while rank 0 times the kernels, and a busy-waiting
    // MPI halves what it measures.
    throw UsageError(
        "plan --profile cpu measures this machine: run it as one process "
        "(--processes N says how many the planned run has)");
  }
  if (comm.rank() != 0) return kExitOk;  // nothing runs; rank 0 answers
  int processes = o.processes;
  if (processes == 0) {
    processes = 1;  // a run of paged cases only
    for (const CaseSpec& s : run.cases) processes = std::max(processes, s.num_logical_ranks());
  }
  const Profile pf = o.profile == "cpu" ? measure_cpu(processes) : device_profile(o);
  const Problem& p = q.problem;
  std::FILE* out = o.run.json ? stderr : stdout;
  const bool verbose = !o.run.quiet;
  if (verbose) {
    std::fprintf(
        out, "# cpdrift plan: B=%d S=%lld Hq=%d Hkv=%d D=%d causal, dtype %s; %zu case%s\n",
        p.batch, static_cast<long long>(p.seq_len), p.dims.num_q_heads, p.dims.num_kv_heads,
        p.dims.head_dim, to_string(p.dtype), run.cases.size(), run.cases.size() == 1 ? "" : "s");
    if (pf.name == "cpu") {
      std::fprintf(out, "# profile: cpu, %d process%s; %s\n", processes, processes == 1 ? "" : "es",
                   pf.source.c_str());
    } else {
      std::fprintf(out,
                   "# profile: %s — %.0f TFLOP/s BF16, %.0f TFLOP/s FP32, HBM %.1f TB/s, NVLink "
                   "%.0f GB/s, network %.0f GB/s, %d GPUs per node, one logical rank per GPU\n",
                   pf.name.c_str(), pf.bf16_flops * 1e-12, pf.fp32_flops * 1e-12, pf.hbm * 1e-12,
                   pf.nvlink * 1e-9, pf.network * 1e-9, pf.processes_per_node);
    }
    std::fprintf(out,
                 "# FLOPs: 4*D per visible (row, key) pair forward, 10*D backward; bytes: "
                 "header + payload of every message, as a %s run counts them\n",
                 gpu_run(q, pf) ? "CUDA" : "CPU");
    if (!run.paged.empty()) {
      std::fprintf(out, "# %zu paged case%s not planned (one process each, no messages)\n",
                   run.paged.size(), run.paged.size() == 1 ? "" : "s");
    }
  }
  json::Value doc = json::Value::object();
  doc["schema_version"] = "cpdrift_plan/v1";
  doc["profile"] = pf.name;
  doc["device"] = gpu_run(q, pf) ? "cuda" : "cpu";  // whose forward paths the counts are
  doc["profile_source"] = pf.source;
  doc["processes"] = processes;
  doc["seq_len"] = p.seq_len;
  doc["batch"] = p.batch;
  json::Value cases = json::Value::array();
  double total = 0;
  // Host threads per process as a run's default (cores shared by the node's processes).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  RunMemoryPlan memory(p, processes,
                       std::max(1, cores / std::min(processes, pf.processes_per_node)));
  std::uint64_t peak_memory = 0;
  for (std::size_t i = 0; i < run.cases.size(); ++i) {
    const CaseSpec& spec = run.cases[i];
    CasePlan c = plan_case(p, q, spec, pf, processes);
    c.memory = memory.add_case(
        c.grid,
        CaseMemoryOptions{c.paths, q.include_backward, q.include_dlogp ? q.vocab_size : 0,
                          i + 1 == run.cases.size() && run.paged.empty(), q.include_lane_backward});
    for (const ProcessMemory& m : c.memory) peak_memory = std::max(peak_memory, m.peak().bytes());
    const Pick pick = pick_protocol(p, q, c, pf, processes);
    if (verbose) print_case(out, p, c, pick);
    cases.push_back(case_json(p, c, pick));
    total += c.seconds;
  }
  doc["cases"] = std::move(cases);
  doc["estimated_seconds"] = total;
  doc["peak_memory_bytes_per_process"] = peak_memory;
  if (verbose) {
    std::fprintf(out, "\n# estimated total: %s; peak memory %.0f MB per process\n",
                 duration(total).c_str(), static_cast<double>(peak_memory) * 1e-6);
  }
  const std::string text = json::to_string(doc);
  if (!o.run.output.empty()) json::write_file_atomic(o.run.output, text);
  if (o.run.json) std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

}  // namespace cpd
