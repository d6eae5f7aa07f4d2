#include "cpdrift/engine/case_runner.h"

#include <stdexcept>

#include "case_execution.h"
#include "case_legs.h"
#include "cpdrift/engine/merge_checks.h"
#include "cpdrift/engine/tensor_layout.h"
#include "cpdrift/numerics/bf16.h"

namespace cpd {
namespace {

constexpr PathSpec kFp32Path{InputPrecision::fp32, ProbRounding::none};
constexpr PathSpec kBf16InputsPath{InputPrecision::bf16, ProbRounding::none};
constexpr PathSpec kBf16KernelPath{InputPrecision::bf16, ProbRounding::bf16};
constexpr PathSpec kUnfusedPath{InputPrecision::bf16, ProbRounding::none,
                                BlockKernel::cublas_unfused};

// A case's arithmetic paths through its protocol, one output per hosted rank each.
struct PathRuns {
  std::vector<RankOutput> fp32;      // with the merge checks and the record of the states
  std::vector<RankOutput> bf16;      // BF16 inputs, FP32 P (under --dtype bf16)
  std::vector<RankOutput> kernel;    // the BF16 flash kernel
  std::vector<RankOutput> unfused;   // cuBLAS GEMMs (GPU backends)
  std::vector<RankOutput> cpu_fp32;  // the FP32 path again on the CPU (GPU runs)
};

PathRuns run_paths(const RunContext& ctx, const CaseGrid& grid) {
  PathRuns runs;
  runs.fp32 = run_protocol(grid, kFp32Path, ctx.transport, ctx.inputs, true);
  if (ctx.problem.dtype == DType::bf16)
    runs.bf16 = run_protocol(grid, kBf16InputsPath, ctx.transport, ctx.inputs, false);
  runs.kernel = run_protocol(grid, kBf16KernelPath, ctx.transport, ctx.inputs, false);
  if (ctx.inputs.backend().has_unfused_gemm())
    runs.unfused = run_protocol(grid, kUnfusedPath, ctx.transport, ctx.inputs, false);
  if (ctx.cpu_rerun_inputs != nullptr)
    runs.cpu_fp32 = run_protocol(grid, kFp32Path, ctx.transport, *ctx.cpu_rerun_inputs, false);
  return runs;
}

// The final write of a BF16 kernel on `a` itself: out rounded once to BF16, lse kept.
const AttnShard& write_bf16_in_place(AttnShard& a) {
  for (float& x : a.out.data) x = round_bf16(x);
  return a;
}

// One attention tensor of a case: this process's shard of it per hosted rank.
using HostedAttention = std::vector<const AttnShard*>;

// Publishes <case>/<leg>/{out,lse}; the comparison's candidate is the published tensor.
void publish_attention(const RunContext& ctx, const CaseGrid& grid, CaseOutputs& o,
                       const std::string& leg, const HostedAttention& hosted, bool bf16_out,
                       bool digest, OutLseComparison* candidate_of = nullptr,
                       OutLseComparison* also = nullptr) {
  std::vector<const Shard*> outs, lses;
  for (const AttnShard* a : hosted) {
    outs.push_back(&a->out);
    lses.push_back(&a->lse);
  }
  const std::string base = case_group(o.name) + "/" + leg + "/";
  const int dim = grid.problem.dims.head_dim;
  const int first = static_cast<int>(o.tensors.size());
  o.tensors.push_back(
      case_tensor(grid, ctx.transport, base + "out", outs, dim, HeadKind::query, bf16_out, digest));
  o.tensors.push_back(
      case_tensor(grid, ctx.transport, base + "lse", lses, 1, HeadKind::query, false, digest));
  for (OutLseComparison* c : {candidate_of, also}) {
    if (c == nullptr) continue;
    c->out.candidate_tensor = first;
    c->lse.candidate_tensor = first + 1;
  }
}

// The forward comparisons of a case and the tensors they publish; returns per hosted rank the
// dtype path's output as written and the FP32 reference (the dlogp leg projects both).
struct ForwardWritten {
  std::vector<const AttnShard*> dtype_written, reference;
};

// The BF16 paths' outputs are written in place (their unrounded values are compared nowhere).
ForwardWritten add_forward(const RunContext& ctx, const CaseGrid& grid, PathRuns& runs,
                           CaseOutputs& o) {
  const Problem& p = ctx.problem;
  const bool bf16 = p.dtype == DType::bf16;
  const std::vector<Range> reference_grid{Range{0, p.seq_len}};
  const std::vector<Range> counterpart_grid =
      kv_block_bounds(cp1_counterpart(grid.spec), p.seq_len);
  HostedAttention reference, fp32, dtype, kernel, unfused, cpu;
  ForwardWritten written;
  // Decided alike on every process (a process may host no rank of the case, and every process
  // must publish and measure the same tensors).
  if (ctx.inputs.backend().has_unfused_gemm()) o.cublas_unfused.emplace();
  if (ctx.cpu_rerun_inputs != nullptr) o.cuda_vs_cpu_fp32.emplace();
  for (std::size_t i = 0; i < runs.fp32.size(); ++i) {
    const RankOutput& run = runs.fp32[i];
    const int r = run.rank.cp_rank;
    const ShardShape rows = run.merged.out.shape;
    const AttnShard& ref =
        o.held.keep(ctx.cp1_results.get(ctx.inputs, kFp32Path, reference_grid, rows));
    const AttnShard& counterpart =
        o.held.keep(ctx.cp1_results.get(ctx.inputs, kFp32Path, counterpart_grid, rows));
    const AttnShard& dtype_written = bf16 ? write_bf16_in_place(runs.bf16[i].merged) : run.merged;
    const AttnShard& kernel_written = write_bf16_in_place(runs.kernel[i].merged);
    const MergeChecks& checks = *run.checks;  // the FP32 path runs with them
    o.cp_merge_fp32.add(r, run.merged, ref);
    o.dtype_path.add(r, dtype_written, ref);
    o.bf16_kernel.add(r, kernel_written, ref);
    o.topology.add(r, run.merged, counterpart);
    o.merge_probe.add(r, checks.probe, run.merged);
    o.merge_oracle.out.add_diffs(r, checks.oracle_out);
    o.merge_oracle.lse.add_diffs(r, checks.oracle_lse);
    if (o.cublas_unfused) {
      const AttnShard& u = write_bf16_in_place(runs.unfused[i].merged);
      o.cublas_unfused->add(r, u, ref);
      unfused.push_back(&u);
    }
    if (o.cuda_vs_cpu_fp32) {
      o.cuda_vs_cpu_fp32->add(r, runs.cpu_fp32[i].merged, run.merged);
      cpu.push_back(&runs.cpu_fp32[i].merged);
    }
    reference.push_back(&ref);
    fp32.push_back(&run.merged);
    dtype.push_back(&dtype_written);
    kernel.push_back(&kernel_written);
    written.dtype_written.push_back(&dtype_written);
    written.reference.push_back(&ref);
  }
  publish_attention(ctx, grid, o, "reference_fp32", reference, false, false);
  publish_attention(ctx, grid, o, "candidate_fp32", fp32, false, true, &o.cp_merge_fp32,
                    &o.topology);
  if (bf16) {
    publish_attention(ctx, grid, o, "candidate_bf16", dtype, true, true, &o.dtype_path);
  } else {
    o.dtype_path.out.candidate_tensor = o.cp_merge_fp32.out.candidate_tensor;
    o.dtype_path.lse.candidate_tensor = o.cp_merge_fp32.lse.candidate_tensor;
  }
  publish_attention(ctx, grid, o, "bf16_kernel", kernel, true, true, &o.bf16_kernel);
  if (o.cublas_unfused) {
    publish_attention(ctx, grid, o, "cublas_unfused", unfused, true, true, &*o.cublas_unfused);
  }
  if (o.cuda_vs_cpu_fp32) {
    publish_attention(ctx, grid, o, "cpu_fp32", cpu, false, true, &*o.cuda_vs_cpu_fp32);
  }
  return written;
}

}  // namespace

Shard bf16_written(const Shard& s) {
  Shard w = s;
  for (float& x : w.data) x = round_bf16(x);
  return w;
}

AttnShard final_write(const AttnShard& merged, bool bf16) {
  return bf16 ? AttnShard{bf16_written(merged.out), merged.lse} : merged;
}

void run_case(const RunContext& ctx, const CaseSpec& spec, CaseSink& sink) {
  run_case(ctx, spec, CaseGrid(ctx.problem, spec, ctx.round_rows), sink);
}

void run_case(const RunContext& ctx, const CaseSpec& requested, const CaseGrid& grid,
              CaseSink& sink) {
  const CaseSpec& ran = grid.spec;
  if (ran.tp != requested.tp || ran.cp != requested.cp || ran.layout != requested.layout ||
      ran.protocol != requested.protocol) {
    throw std::invalid_argument("run_case: the grid may differ from the request in its split only");
  }
  CaseOutputs o;
  o.executed.started = std::chrono::steady_clock::now();
  const TransportCounters before = ctx.transport.counters();
  o.spec = requested;
  o.name = case_name(requested, ctx.problem.dtype);
  PathRuns runs = run_paths(ctx, grid);
  const ForwardWritten written = add_forward(ctx, grid, runs, o);
  const CaseSpec counterpart = cp1_counterpart(grid.spec);
  o.topology_required = kv_block_bounds(grid.spec, ctx.problem.seq_len) ==
                        kv_block_bounds(counterpart, ctx.problem.seq_len);
  o.topology_reference = case_name(counterpart, ctx.problem.dtype);
  std::vector<Received> dq_partials;
  if (ctx.cp1_backward != nullptr) dq_partials = case_legs::add_backward(ctx, grid, runs.fp32, o);
  if (ctx.vocab_size > 0) {
    // Candidate: the case's CP output as written (BF16 under --dtype bf16); reference: the
    // FP32 CP=1 output cast the same way.
    std::vector<const AttnShard*> cast;
    for (const AttnShard* r : written.reference)
      cast.push_back(&o.held.keep(final_write(*r, ctx.problem.dtype == DType::bf16)));
    case_legs::add_dlogp(ctx, grid, written.dtype_written, cast, o);
  }
  o.executed = record_execution(ctx, grid, runs.fp32, dq_partials, before, o.executed.started);
  sink.prefill_case(o);
}

}  // namespace cpd
