// `cpdrift plan`: what a run would cost, per case and logical rank, before it runs: the sums over
// each case's schedule (engine/case_schedule.h) -- the kernels' FLOPs and every phase's bytes,
// exactly what the run counts, its memory per process, the time that comes to on a machine's
// figures -- and the protocol that would be quickest.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "cli/commands.h"
#include "cli/kernel_timing.h"
#include "cli/plan_estimate.h"
#include "core/errors.h"
#include "engine/memory_plan.h"
#include "report/json.h"

namespace cpd {
namespace {

// The machine the estimates are for: a device's figures (the h200 defaults or the user's), or
// the host's CPU kernels and memcpy, timed when the plan is made. Link figures are per
// direction and per GPU (process).
struct Profile {
  std::string name;
  double bf16_flops = 0, fp32_flops = 0, fp32_backward_flops = 0;  // FLOP/s of one process
  double hbm = 0, nvlink = 0, network = 0;                         // bytes/s
  int processes_per_node = 8;
  std::string source;  // where the figures come from
};

// The CPU profile: the host's forward and backward kernels and its memcpy, timed when the plan
// is made over every core, shared evenly by `processes` processes on the node.
Profile measure_cpu(int processes) {
  using namespace kernel_timing;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(cores);
  Problem p;
  p.seq_len = 2048;
  const Inputs in = make_inputs(p, InputPrecision::fp32, pool);
  AttnShard out;
  const std::vector<double> fwd = time_forward(p, in, ProbRounding::none, 3, pool, out);
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

// The device profile the plan options describe.
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

double rate_of(const Phase& phase, const Profile& pf) {
  switch (phase.rate) {
    case KernelRate::bf16:
      return pf.bf16_flops;
    case KernelRate::fp32_backward:
      return pf.fp32_backward_flops;
    case KernelRate::fp32:
      break;
  }
  return pf.fp32_flops;
}

// The slowest process of a phase: its kernels (each logical rank's pairs at the phase's rate)
// and its messages through memory, then its messages over the links (no overlap: the exchanges
// are supersteps), the larger of what it sends and what it receives. A message to a logical
// rank on the same process is a move.
PhaseEstimate estimate(const Phase& phase, const Profile& pf, int processes) {
  const PhaseWork& w = phase.work;
  const std::size_t ranks = w.pairs.size();
  std::vector<double> compute(static_cast<std::size_t>(processes), 0.0), send(compute),
      recv(compute);
  const auto proc = [&](std::size_t r) {
    return static_cast<std::size_t>(process_of(static_cast<int>(r), processes));
  };
  // Its kernels, and every message it receives written and read once through memory (the
  // partial states a merge reads back, the rows a kernel reads).
  for (std::size_t r = 0; r < ranks; ++r) {
    compute[proc(r)] +=
        static_cast<double>(w.pairs[r]) * phase.flops_per_pair / rate_of(phase, pf) +
        2.0 * static_cast<double>(w.received[r].bytes) / pf.hbm;
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

// Whether the planned run is a CUDA one (its forward paths, so its bytes): as --device says,
// else as the profile's machine is.
bool gpu_run(const RunRequest& q, const Profile& pf) {
  return q.device == Device::cuda || (q.device == Device::auto_select && pf.name != "cpu");
}

// Every phase of the case's schedule estimated on the profile: a phase on the host's CPU (this
// tool's CP=1 checks, the host's re-run) only when the profile is the CPU's.
CasePlan plan_case(const RunRequest& q, const CaseSpec& spec, const Profile& pf, int processes) {
  CasePlan c{
      schedule_case(CaseGrid(q.problem, spec, q.round_rows), schedule_options(q, gpu_run(q, pf)))};
  const int world = std::min(processes, spec.num_logical_ranks());
  for (const Phase& phase : c.schedule.phases) {
    const PhaseEstimate e =
        !phase.host || pf.name == "cpu" ? estimate(phase, pf, world) : PhaseEstimate{};
    c.estimates.push_back(e);
    c.seconds += e.total();
  }
  return c;
}

Pick pick_protocol(const RunRequest& q, const CasePlan& planned, const Profile& pf, int processes) {
  // The others' forward only (the backward and dlogp do not depend on the protocol).
  Pick best{planned.spec().protocol, ""};
  if (planned.spec().cp == 1) {  // no CP exchange: the protocols are the same work
    best.why = "CP=1: no partial state crosses a CP rank, so every protocol is the same work";
    return best;
  }
  RunRequest forward_only = q;
  forward_only.include_backward = forward_only.include_dlogp = false;
  double best_s = -1;
  std::uint64_t best_bytes = 0;
  std::string why;
  for (const Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv}) {
    CaseSpec s = planned.spec();
    s.protocol = protocol;
    std::optional<CasePlan> other;
    if (protocol != planned.spec().protocol) other = plan_case(forward_only, s, pf, processes);
    const CasePlan& c = other ? *other : planned;
    const double t = c.estimate_of(&c.forward()).total();
    const std::uint64_t bytes = c.forward().work.total_sent().bytes;
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

int plan_command(const PlanOptions& o, const CommContext& comm) {
  const RunRequest& q = o.run.request;
  const RunPlan run = plan_run(q);
  check_output_path(o.run.output, comm);
  check_countable(q, run);
  if (o.profile == "cpu" && comm.size() > 1) {
    // The other processes would idle in MPI while rank 0 times the kernels, and a busy-waiting
    // MPI takes cores from what it measures.
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
    std::fprintf(out,
                 "# cpdrift plan: %s B=%d S=%lld Hq=%d Hkv=%d D=%d causal, dtype %s; %zu case%s\n",
                 p.dims.name.c_str(), p.batch, static_cast<long long>(p.seq_len),
                 p.dims.num_q_heads, p.dims.num_kv_heads, p.dims.head_dim, to_string(p.dtype),
                 run.cases.size(), run.cases.size() == 1 ? "" : "s");
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
  doc["model"] = p.dims.name;
  doc["model_source"] = p.dims.source;
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
    CasePlan c = plan_case(q, run.cases[i], pf, processes);
    c.memory = memory.add_case(c.schedule, i + 1 == run.cases.size() && run.paged.empty());
    for (const ProcessMemory& m : c.memory) peak_memory = std::max(peak_memory, m.peak().bytes());
    const Pick pick = pick_protocol(q, c, pf, processes);
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