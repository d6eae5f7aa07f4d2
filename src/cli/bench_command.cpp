// `cpdrift bench`: forward throughput of the CPU kernels (or, with --device cuda, of the GPU
// paths against PyTorch's SDPA) on the causal attention of the model asked for.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include "cli/bench_baselines.h"
#include "cli/bench_layer.h"
#include "cli/commands.h"
#include "cli/kernel_timing.h"
#include "comm/agree.h"
#include "core/errors.h"
#include "core/util/work_timers.h"
#include "engine/case_runner.h"
#include "engine/local_run.h"
#include "engine/paged/paged_cache.h"
#include "engine/run_session.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/simd_info.h"
#include "report/run_recorder.h"

namespace cpd {
namespace {

using namespace kernel_timing;

// One path: best and median seconds, GFLOP/s of the best, and its fraction of `peak` FLOP/s.
void print_row(const char* name, const std::vector<double>& times, double flops, double peak,
               const char* note = "") {
  const double rate = flops / times.front();
  std::printf("  %-26s %10.3f %10.3f %12.1f %8.0f%%%s\n", name, times.front(),
              times[times.size() / 2], rate * 1e-9, 100.0 * rate / peak, note);
  std::fflush(stdout);
}

// The inputs' K and V in a paged cache of `page_size`, physical pages shuffled.
PagedKvCache paged_copy(const Problem& p, const Inputs& in, int page_size) {
  const std::vector<std::int64_t> lens(static_cast<std::size_t>(p.batch), p.seq_len);
  PagedKvCache cache(make_page_table(lens, page_size, 0, PageLayout::permuted, p.seed),
                     Range{0, p.dims.num_kv_heads}, p.dims.head_dim);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.dims.num_kv_heads; ++h)
      cache.write_sequence(b, h, in.k.at(b, h, 0), in.v.at(b, h, 0));
  }
  return cache;
}

// "123.4 GFLOP/s" for the FP32 reference (a one-thread-per-row canonical fold), TFLOP/s for
// the tensor-core and cuBLAS paths.
std::string throughput(const std::string& path, double flops, double seconds) {
  const bool giga = path.find("fp32") != std::string::npos;
  char text[32];
  std::snprintf(text, sizeof text, "%.2f %s", flops / seconds * (giga ? 1e-9 : 1e-12),
                giga ? "GFLOP/s" : "TFLOP/s");
  return text;
}

// The GPU paths at each sequence length, with PyTorch's fastest SDPA backend as the yardstick.
int bench_cuda(const BenchOptions& o, const std::vector<std::int64_t>& seq_lens) {
  std::printf(
      "# cpdrift bench --device cuda: causal forward and the layer's q_proj, B=%d Hq=%d Hkv=%d "
      "D=%d, cuda:0; median of %d runs\n",
      o.problem.batch, o.problem.dims.num_q_heads, o.problem.dims.num_kv_heads,
      o.problem.dims.head_dim, o.repeats);
  std::printf("# %-8s %-34s %12s %16s\n", "S", "path", "median (ms)", "throughput");
  for (const std::int64_t s : seq_lens) {
    Problem p = o.problem;
    p.seq_len = s;
    const double flops = forward_flops(p);
    double bf16_seconds = 0;
    for (const DeviceBenchFigure& f : cuda_bench(p, o.repeats, 0)) {
      std::printf("  %-8lld %-34s %12.3f %16s\n", static_cast<long long>(s), f.name.c_str(),
                  f.seconds * 1e3,
                  throughput(f.name, f.flops > 0 ? f.flops : flops, f.seconds).c_str());
      if (f.name == "bf16_kernel") bf16_seconds = f.seconds;
      std::fflush(stdout);
    }
    std::string why;
    if (const auto torch = time_torch_sdpa(p, o.repeats, 0, why)) {
      const std::string name = "torch_sdpa " + torch->backend + " (" + torch->torch_version + ")";
      std::printf("  %-8lld %-34s %12.3f %16s\n", static_cast<long long>(s), name.c_str(),
                  torch->seconds * 1e3, throughput(name, flops, torch->seconds).c_str());
      std::printf("  %-8lld %-34s %12s %15.2fx\n", static_cast<long long>(s),
                  "bf16_kernel speed / torch_sdpa", "", torch->seconds / bf16_seconds);
    } else {
      std::printf("  %-8lld %-34s not measured: %s\n", static_cast<long long>(s), "torch_sdpa",
                  why.c_str());
    }
    std::fflush(stdout);
  }
  return kExitOk;
}

// The eager baseline beside the FP32 reference: its time on the same inputs and FLOP count,
// how far its output is from the reference's, and the ratio of the two times.
void eager_row(const Problem& p, const Inputs& in, const AttnShard& reference,
               double reference_seconds, int repeats, int threads, double flops, double peak,
               ThreadPool& pool) {
  std::unique_ptr<EagerAttention> eager;
  try {
    eager = std::make_unique<EagerAttention>(threads);
  } catch (const std::runtime_error& e) {
    std::printf("  %-26s not measured: %s\n", "eager_openblas", e.what());
    return;
  }
  AttnShard out;
  const std::vector<double> times = times_of(repeats, [&] {
    const auto t = Clock::now();
    out = eager->forward(in.q, in.k, in.v, p.dims.softmax_scale(), pool);
    return seconds_since(t);
  });
  double worst = 0;
  for (std::size_t i = 0; i < out.out.data.size(); ++i) {
    const double d = std::abs(out.out.data[i] - reference.out.data[i]);
    if (!(d <= worst)) worst = d;  // a NaN stays
  }
  char note[96];
  std::snprintf(note, sizeof note,
                "   max |out - fp32_reference| %.1e; fp32_reference is %.2fx faster", worst,
                times.front() / reference_seconds);
  print_row("eager_openblas (S*S scores)", times, flops, peak, note);
  std::printf("  %-26s %s, %s; %s\n", "  (OpenBLAS)", eager->corename.c_str(),
              eager->core_choice.c_str(), eager->config.c_str());
  std::fflush(stdout);
}

// One run of a whole case in this process: its wall time and the work timers' seconds.
struct CaseCost {
  double total = 0;
  std::array<double, kWorkKindNames.size()> work{};
  double seconds(WorkKind k) const { return work[static_cast<std::size_t>(k)]; }
  double outside_timers() const { return total - std::accumulate(work.begin(), work.end(), 0.0); }
};

// A fresh LocalRun each time: no CP=1 result or input is served from an earlier run's memo.
CaseCost time_case(const Problem& p, const CaseSpec& spec, ThreadPool& pool) {
  const LocalRun local(p, pool, true, RunRequest{}.vocab_size);
  RunReport report;
  RunRecorder recorder(report, local.one, pool, false, nullptr);
  reset_work_seconds();
  const auto t = Clock::now();
  run_case(local.ctx, spec, recorder);
  CaseCost cost;
  cost.total = seconds_since(t);
  for (std::size_t k = 0; k < cost.work.size(); ++k)
    cost.work[k] = work_seconds(static_cast<WorkKind>(k));
  return cost;
}

// One whole case in this process (every logical rank, the in-process transport), run twice:
// its wall time against the work timers' kinds, so the time outside the kernels shows. The
// first run is the process's first touch of most of its peak memory (the kernel clears each
// fresh page); the second reuses the heap, as every case after a run's first does.
void whole_case(const Problem& p, ThreadPool& pool) {
  const CaseSpec spec{2, 2, std::min<std::int64_t>(512, p.seq_len / 4), CpLayout::contiguous,
                      Protocol::ag_rs};
  if (!validate_case(spec, p).empty()) return;
  const CaseCost first = time_case(p, spec, pool);
  const CaseCost again = time_case(p, spec, pool);
  std::printf(
      "# whole case %s (forward paths, backward, dlogp; %d logical ranks in this process), "
      "run twice:\n#   first: the process's first touch of its peak memory; again: the heap "
      "reused\n",
      case_name(spec, p).c_str(), spec.num_logical_ranks());
  std::printf("  %-28s %10s %7s %10s\n", "", "first (s)", "", "again (s)");
  const auto row = [&](const char* name, double a, double b) {
    std::printf("  %-28s %10.3f %6.1f%% %10.3f %6.1f%%\n", name, a, 100 * a / first.total, b,
                100 * b / again.total);
  };
  for (std::size_t k = 0; k < kWorkKindNames.size(); ++k)
    row(kWorkKindNames[k], first.work[k], again.work[k]);
  row("other (copies, bookkeeping)", first.outside_timers(), again.outside_timers());
  row("whole case", first.total, again.total);
  // dlogp's lm_head projection is a kernel pass too: a GEMM over the vocabulary of the
  // candidate's and the reference's rows, as many FLOPs as two causal forwards when the
  // vocabulary is S words (the default 4096 at S = 4096).
  const auto ratios = [](const CaseCost& c) {
    const double attention = c.seconds(WorkKind::kernels);
    return std::pair{c.total / attention, c.total / (attention + c.seconds(WorkKind::projection))};
  };
  const auto [first_attention, first_passes] = ratios(first);
  const auto [again_attention, again_passes] = ratios(again);
  std::printf("  %-28s %10.2f %7s %10.2f\n", "case / attention kernels", first_attention, "",
              again_attention);
  std::printf("  %-28s %10.2f %7s %10.2f   (attention kernels + lm_head projection)\n",
              "case / kernel passes", first_passes, "", again_passes);
  std::fflush(stdout);
}

// Refuses, before any work, a problem whose CPU benchmark cannot hold at once what its eager
// baseline does: q, k and v in FP32, the reference's output and its own, and every (row, key)
// score of a head, S x S.
void check_bench_memory(const Problem& p, int processes_on_node) {
  const MemoryBudget budget = memory_budget(processes_on_node);
  const ModelDims& d = p.dims;
  const auto rows = static_cast<std::uint64_t>(p.batch) * static_cast<std::uint64_t>(p.seq_len) *
                    static_cast<std::uint64_t>(d.head_dim);
  const auto seq = static_cast<std::uint64_t>(p.seq_len);
  const std::uint64_t need =
      sizeof(float) *
      (rows * static_cast<std::uint64_t>(3 * d.num_q_heads + 2 * d.num_kv_heads) + seq * seq);
  if (budget.bytes != 0 && need > budget.bytes) {
    refuse_memory(0, need,
                  "at once (its inputs, two outputs and the eager baseline's S x S scores)", budget,
                  "use a smaller --seq-len or --batch");
  }
}

}  // namespace

int bench_command(const BenchOptions& o, const CommContext& comm) {
  if (o.device == Device::cuda && !cuda_backend_built()) {
    throw UsageError("--device cuda: built without CUDA (configure with -Dcuda=enabled)");
  }
  // Agreed before rank 0 goes on alone, so that every process ends with the same status.
  bool cuda = false;
  agree_or_throw(comm, comm.rank() == 0, "", [&] {
    if (o.device == Device::cuda && cuda_device_count() == 0)
      throw UsageError("--device cuda: no CUDA device visible to this process");
    cuda = o.device == Device::cuda || (o.device == Device::auto_select && cuda_device_count() > 0);
    if (!cuda) check_bench_memory(o.problem, comm.local_size());
  });
  if (comm.rank() != 0) return kExitOk;  // a single-process benchmark; other ranks idle
  if (cuda) {
    return bench_cuda(o, o.seq_len_given ? std::vector<std::int64_t>{o.problem.seq_len}
                                         : std::vector<std::int64_t>{4096, 16384});
  }
  const Problem& p = o.problem;
  const int threads = o.threads > 0 ? o.threads : default_threads(comm);
  ThreadPool pool(threads);
  const double flops = forward_flops(p);
  std::printf(
      "# cpdrift bench: causal forward, %s B=%d S=%lld Hq=%d Hkv=%d D=%d, %d thread%s (%s)\n",
      p.dims.name.c_str(), p.batch, static_cast<long long>(p.seq_len), p.dims.num_q_heads,
      p.dims.num_kv_heads, p.dims.head_dim, threads, threads == 1 ? "" : "s", cpu_simd_isa());
  std::printf("# work per forward: %.1f GFLOP (2*2*B*Hq*D*S^2/2); best and median of %d runs\n",
              flops * 1e-9, o.repeats);
  const double peak = measure_fma_peak(pool);
  std::printf("# FMA peak: %.1f GFLOP/s (independent 16-lane FMAs on %d thread%s)\n", peak * 1e-9,
              threads, threads == 1 ? "" : "s");
  std::printf("# %-26s %10s %10s %12s %9s\n", "path", "best (s)", "median (s)", "GFLOP/s",
              "of peak");
  const auto generated = [&](InputPrecision precision) {
    const auto t = Clock::now();
    Inputs in = make_inputs(p, precision, pool);
    std::printf("  %-26s %10.3f\n", "  (input generation)", seconds_since(t));
    return in;
  };
  const Inputs fp32 = generated(InputPrecision::fp32);
  AttnShard reference;
  const std::vector<double> reference_times =
      time_forward(p, fp32, ProbRounding::none, o.repeats, pool, reference);
  print_row("fp32_reference", reference_times, flops, peak);
  eager_row(p, fp32, reference, reference_times.front(), o.repeats, threads, flops, peak, pool);
  {
    const Inputs bf16 = generated(InputPrecision::bf16);
    AttnShard out;
    print_row("bf16_kernel_emulated",
              time_forward(p, bf16, ProbRounding::bf16, o.repeats, pool, out), flops, peak);
  }
  {
    // The same FP32 forward reading K/V in place from a paged cache (pages of 16, shuffled):
    // what paging costs the kernel, and whether the bits moved (they must not).
    const PagedKvCache cache = paged_copy(p, fp32, 16);
    AttnShard paged;
    const std::vector<double> times =
        time_forward(p, fp32, ProbRounding::none, o.repeats, pool, paged, &cache);
    const auto same = [](const Shard& a, const Shard& b) {
      return std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) == 0;
    };
    const bool equal = same(paged.out, reference.out) && same(paged.lse, reference.lse);
    print_row("fp32_reference_paged16", times, flops, peak,
              equal ? "   bits == contiguous" : "   bits != contiguous");
  }
  // The backward: 5 matrix products to the forward's 2, so 2.5× the forward's FLOP count.
  print_row("fp32_backward (2.5x flops)", time_backward(p, fp32, reference, o.repeats, pool),
            2.5 * flops, peak);
  bench_layer_projections(p, o.repeats, peak, pool);
  whole_case(p, pool);
  return kExitOk;
}

}  // namespace cpd
