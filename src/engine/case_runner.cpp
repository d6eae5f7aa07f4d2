#include "engine/case_runner.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <stdexcept>

#include "cpdrift/bf16.h"
#include "cpdrift/production_lanes.h"
#include "engine/case_run.h"
#include "engine/merge_checks.h"
#include "engine/rollout_pairs.h"
#include "engine/tensor_layout.h"

namespace cpd {
namespace {

constexpr PathSpec kFp32Path{InputPrecision::fp32, ProbRounding::none};
constexpr PathSpec kBf16InputsPath{InputPrecision::bf16, ProbRounding::none};
constexpr PathSpec kBf16KernelPath{InputPrecision::bf16, ProbRounding::bf16};
constexpr PathSpec kUnfusedPath{InputPrecision::bf16, ProbRounding::none,
                                BlockKernel::cublas_unfused};

// to[i] = round_bf16(from[i]) for i < n, pieces of 64 Ki floats a task (`to` may be `from`).
// The loop vectorises: the rounding is the branch-free form (the same bits for every input),
// and the bound is captured by value, so the stores cannot change it.
void round_bf16_on(const float* from, float* to, std::int64_t n, ThreadPool& pool) {
  constexpr std::int64_t kChunk = 1 << 16;
  pool.parallel_for((n + kChunk - 1) / kChunk, [from, to, n](std::int64_t c) {
    const std::int64_t end = std::min(n, (c + 1) * kChunk);
    for (std::int64_t i = c * kChunk; i < end; ++i)
      to[i] = float_of_bits(bf16_bits_rn_select(bits_of(from[i])) << 16);
  });
}

// The final write of a BF16 kernel on `a` itself: out rounded once to BF16, lse kept.
const AttnShard& write_bf16_in_place(AttnShard& a, ThreadPool& pool) {
  write_bf16_in_place(a.out, pool);
  return a;
}

HostedAttention merged_of(const std::vector<RankOutput>& runs) {
  HostedAttention merged;
  for (const RankOutput& run : runs) merged.push_back(&run.merged);
  return merged;
}

// Publishes <case>/<leg>/{out,lse} in `part`; `candidate_of`: the comparisons whose candidate
// is the published tensor (null: one this run does not make).
void publish_attention(const CaseRun& r, CasePart& part, const std::string& leg,
                       const HostedAttention& hosted, bool bf16_out, bool digest,
                       std::initializer_list<OutLseComparison*> candidate_of = {}) {
  std::vector<const Shard*> outs, lses;
  for (const AttnShard* a : hosted) {
    outs.push_back(&a->out);
    lses.push_back(&a->lse);
  }
  const std::string base = case_group(r.record.name) + "/" + leg + "/";
  const int dim = r.grid.problem.dims.head_dim;
  const int first = static_cast<int>(part.tensors.size());
  part.tensors.push_back(case_tensor(r.grid, r.ctx.transport, base + "out", outs, dim,
                                     HeadKind::query, bf16_out, digest));
  part.tensors.push_back(
      case_tensor(r.grid, r.ctx.transport, base + "lse", lses, 1, HeadKind::query, false, digest));
  for (OutLseComparison* c : candidate_of) {
    if (c == nullptr) continue;  // a comparison this run does not make
    c->out.candidate_tensor = first;
    c->lse.candidate_tensor = first + 1;
  }
}

// The FP32 path's part: vs the reference, vs the CP=1 counterpart (topology), and the merge
// checks on its states (probe, FP64 oracle). Under --dtype fp32 it is the dtype path too.
void fp32_part(const CaseRun& r) {
  const RunContext& ctx = r.ctx;
  const std::vector<RankOutput>& fp32 = r.fp32;
  const bool dtype_is_fp32 = ctx.problem.dtype == DType::fp32;
  const std::vector<Range> counterpart_grid =
      kv_block_bounds(cp1_counterpart(r.grid.spec), ctx.problem.seq_len);
  CasePart part(r.grid.spec.cp);
  OutLseComparison& cp_merge = part.cp_merge_fp32.emplace();
  OutLseComparison& topology = part.topology.emplace();
  OutLseComparison& probe = part.merge_probe.emplace();
  OutLseComparison& oracle = part.merge_oracle.emplace();
  if (dtype_is_fp32) part.dtype_path.emplace();
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    const RankOutput& run = fp32[i];
    const int cp = run.rank.cp_rank;
    const AttnShard& counterpart = part.held.keep(
        ctx.cp1_results.get(ctx.inputs, kFp32Path, counterpart_grid, run.merged.out.shape));
    const MergeChecks& checks = *run.checks;  // the FP32 path runs with them
    cp_merge.add(cp, run.merged, *r.reference[i]);
    topology.add(cp, run.merged, counterpart);
    probe.add(cp, checks.probe, run.merged);
    oracle.out.add_diffs(cp, checks.oracle_out);
    oracle.lse.add_diffs(cp, checks.oracle_lse);
    if (dtype_is_fp32) part.dtype_path->add(cp, run.merged, *r.reference[i]);
  }
  publish_attention(r, part, "reference_fp32", r.reference, false, false);
  publish_attention(r, part, "candidate_fp32", merged_of(fp32), false, true,
                    {&cp_merge, &topology, part.dtype_path ? &*part.dtype_path : nullptr});
  r.sink.prefill_part(part);
}

// Another path's part: its outputs as written (BF16 in place when `bf16_out`) vs `against`
// per hosted rank, published as <case>/<leg>, measured into `slot`.
void path_part(const CaseRun& r, std::vector<RankOutput>& runs, const HostedAttention& against,
               const char* leg, bool bf16_out, std::optional<OutLseComparison> CasePart::*slot) {
  CasePart part(r.grid.spec.cp);
  OutLseComparison& c = (part.*slot).emplace();
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (bf16_out) write_bf16_in_place(runs[i].merged, r.ctx.pool);
    c.add(runs[i].rank.cp_rank, runs[i].merged, *against[i]);
  }
  publish_attention(r, part, leg, merged_of(runs), bf16_out, true, {&c});
  r.sink.prefill_part(part);
}

// The production lanes of the BF16-kernel path's states (numerics.md §10), each vs the FP32
// reference and vs the canonical merge of the same states (`kernel`, written as BF16),
// published as <case>/<lane>.
void lanes_part(const CaseRun& r, const std::vector<RankOutput>& kernel) {
  CasePart part(r.grid.spec.cp);
  for (std::size_t k = 0; k < kProductionLanes.size(); ++k) {
    LaneComparisons& c = part.lanes.emplace_back(LaneComparisons{kProductionLanes[k], {}, {}});
    HostedAttention lane;
    for (std::size_t i = 0; i < kernel.size(); ++i) {
      const RankOutput& run = kernel[i];
      c.vs_reference.add(run.rank.cp_rank, run.lanes[k], *r.reference[i]);
      c.vs_canonical.add(run.rank.cp_rank, run.lanes[k], run.merged);
      lane.push_back(&run.lanes[k]);
    }
    publish_attention(r, part, to_string(kProductionLanes[k]), lane, true, true,
                      {&c.vs_reference, &c.vs_canonical});
  }
  r.sink.prefill_part(part);
}

// The trainer's side of the trainer-vs-rollout pairs: what its production kernel wrote (the
// BF16-kernel path, or the FP32 path under --dtype fp32) at the rollout's decoded positions.
void capture_decoded(const CaseRun& r, const HostedAttention& written,
                     const char* merge = "canonical") {
  if (r.ctx.decoded == nullptr) return;
  DecodedRows rows =
      gather_trainer_rows(r.ctx, r.grid, r.record.name, written, r.ctx.decoded->workload,
                          std::string(merge) == "canonical");
  rows.merge = merge;
  r.ctx.decoded->trainer.push_back(std::move(rows));
}

}  // namespace

void write_bf16_in_place(Shard& s, ThreadPool& pool) {
  round_bf16_on(s.data.data(), s.data.data(), static_cast<std::int64_t>(s.data.size()), pool);
}

Shard bf16_written(const Shard& s, ThreadPool& pool) {
  Shard w(s.shape, Uninitialized{});  // every element written below
  round_bf16_on(s.data.data(), w.data.data(), static_cast<std::int64_t>(s.data.size()), pool);
  return w;
}

AttnShard final_write(const AttnShard& merged, bool bf16, ThreadPool& pool) {
  return bf16 ? AttnShard{bf16_written(merged.out, pool), merged.lse} : merged;
}

namespace phase_run {

void reference_forward(CaseRun& r) {
  const Problem& p = r.ctx.problem;
  for (const LogicalRank& rank : hosted_ranks(r.grid, r.ctx.transport)) {
    r.reference.push_back(
        &r.references.keep(r.ctx.cp1_results.get(r.ctx.inputs, kFp32Path, {Range{0, p.seq_len}},
                                                 query_shape(r.grid, rank, p.dims.head_dim))));
  }
}

// Each path measured and freed before the next runs, but for the FP32 path's runs (the
// backward's start) and the dtype path's output as written (dlogp's candidate: the BF16-inputs
// path under --dtype bf16, else the FP32 path).
void forward_path(CaseRun& r, const ForwardPath& path) {
  const RunContext& ctx = r.ctx;
  const auto run = [&](const PathSpec& spec, MergeExtras extras, InputStore& inputs) {
    return run_protocol(r.grid, spec, ctx.transport, inputs, extras);
  };
  switch (path.kind) {
    case ForwardPathKind::fp32:
      r.fp32 = run(kFp32Path, {.checks = true}, ctx.inputs);
      fp32_part(r);
      if (ctx.problem.dtype == DType::fp32) capture_decoded(r, merged_of(r.fp32));
      for (RankOutput& o : r.fp32) o.checks.reset();  // the probe and oracle are measured
      r.dtype_written = merged_of(r.fp32);
      break;
    case ForwardPathKind::bf16_inputs:
      r.dtype_runs = run(kBf16InputsPath, {}, ctx.inputs);
      path_part(r, r.dtype_runs, r.reference, "candidate_bf16", true, &CasePart::dtype_path);
      r.dtype_written = merged_of(r.dtype_runs);
      break;
    case ForwardPathKind::bf16_kernel: {
      std::vector<RankOutput> kernel = run(kBf16KernelPath, {.lanes = true}, ctx.inputs);
      path_part(r, kernel, r.reference, "bf16_kernel", true, &CasePart::bf16_kernel);
      lanes_part(r, kernel);
      if (ctx.problem.dtype == DType::bf16) {
        capture_decoded(r, merged_of(kernel));
        for (std::size_t k = 0; k < kProductionLanes.size(); ++k) {
          HostedAttention lane;
          for (const RankOutput& o : kernel) lane.push_back(&o.lanes[k]);
          capture_decoded(r, lane, to_string(kProductionLanes[k]));
        }
      }
      break;
    }
    case ForwardPathKind::cublas_unfused: {
      std::vector<RankOutput> unfused = run(kUnfusedPath, {}, ctx.inputs);
      path_part(r, unfused, r.reference, "cublas_unfused", true, &CasePart::cublas_unfused);
      break;
    }
    case ForwardPathKind::cpu_fp32: {
      std::vector<RankOutput> cpu = run(kFp32Path, {}, *ctx.cpu_rerun_inputs);
      path_part(r, cpu, merged_of(r.fp32), "cpu_fp32", false, &CasePart::cuda_vs_cpu_fp32);
      break;
    }
  }
}

}  // namespace phase_run

ScheduleOptions schedule_options(const RunContext& ctx) {
  // Decided alike on every process (a process may host no rank of the case, and every process
  // must publish and measure the same tensors).
  return ScheduleOptions{forward_paths(ctx.problem.dtype, ctx.inputs.backend().has_unfused_gemm(),
                                       ctx.cpu_rerun_inputs != nullptr),
                         ctx.cp1_backward != nullptr, ctx.te_p2p_backward, ctx.vocab_size};
}

void run_case(const RunContext& ctx, const CaseSpec& spec, CaseSink& sink) {
  run_schedule(ctx, spec,
               schedule_case(CaseGrid(ctx.problem, spec, ctx.round_rows), schedule_options(ctx)),
               sink);
}

void run_schedule(const RunContext& ctx, const CaseSpec& requested, const CaseSchedule& schedule,
                  CaseSink& sink) {
  const CaseGrid& grid = schedule.grid;
  const CaseSpec& ran = grid.spec;
  if (ran.tp != requested.tp || ran.cp != requested.cp || ran.layout != requested.layout ||
      ran.protocol != requested.protocol) {
    throw std::invalid_argument("run_case: the grid may differ from the request in its split only");
  }
  const Problem& p = ctx.problem;
  CaseRun run(ctx, grid, sink);
  CaseRecord& record = run.record;
  record.executed.started = std::chrono::steady_clock::now();
  run.before = ctx.transport.counters();
  record.spec = requested;
  record.name = case_name(requested, p);
  const CaseSpec counterpart = cp1_counterpart(grid.spec);
  record.topology_required =
      kv_block_bounds(grid.spec, p.seq_len) == kv_block_bounds(counterpart, p.seq_len);
  record.topology_reference = case_name(counterpart, p);
  for (const Phase& phase : schedule.phases) {
    phase.run(run);
    if (ctx.progress != nullptr) ctx.progress->phase_done(phase.name, phase.flops());
  }
  run.dtype_runs.clear();
  run.dtype_written.clear();
  run.release_references();
  if (ctx.vocab_size > 0) record.vocab_size = ctx.vocab_size;
  record.executed = record_execution(ctx, grid, run.fp32, run.folded, run.before,
                                     run.reference_traffic, record.executed.started);
  sink.prefill_case(record);
}

}  // namespace cpd
