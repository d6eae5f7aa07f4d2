#include "cli/plan_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "cli/kernel_timing.h"

namespace cpd {

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

}  // namespace cpd
