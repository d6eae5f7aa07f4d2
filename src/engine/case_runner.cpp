#include "cpdrift/engine/case_runner.h"

#include <chrono>
#include <optional>

#include "case_support.h"
#include "cpdrift/engine/merge_checks.h"
#include "cpdrift/engine/tensor_stream.h"
#include "cpdrift/numerics/bf16.h"

namespace cpd {
namespace {

constexpr PathSpec kFp32Path{InputPrecision::fp32, ProbRounding::none};
constexpr PathSpec kBf16InputsPath{InputPrecision::bf16, ProbRounding::none};
constexpr PathSpec kBf16KernelPath{InputPrecision::bf16, ProbRounding::bf16};
constexpr PathSpec kUnfusedPath{InputPrecision::bf16, ProbRounding::none,
                                BlockKernel::cublas_unfused};

using casework::stats_of;
using casework::Tagged;

struct Comparison {
  Tagged out, lse;
  void add(int cp_rank, const AttnShard& candidate, const AttnShard& reference) {
    out.add(cp_rank, candidate.out, reference.out);
    lse.add(cp_rank, candidate.lse, reference.lse);
  }
  void add_diffs(int cp_rank, const OracleDiffs& d) {
    out.add_diffs(cp_rank, d.out);
    lse.add_diffs(cp_rank, d.lse);
  }
};

OutLseStats stats_pair(const RunContext& ctx, const Comparison& c) {
  return OutLseStats{stats_of(ctx, c.out), stats_of(ctx, c.lse)};
}

// A case's out/lse (one per hosted rank), published under /cases/<case>/<name>/.
struct Published {
  std::string out, lse;
};

Published publish(const RunContext& ctx, const CaseGrid& grid, const std::string& case_name,
                  const char* name, const std::vector<const AttnShard*>& hosted, bool bf16_out) {
  std::vector<const Shard*> outs, lses;
  for (const AttnShard* a : hosted) {
    outs.push_back(&a->out);
    lses.push_back(&a->lse);
  }
  const std::string base = "/cases/" + case_name + "/" + name + "/";
  return Published{
      casework::publish_tensor(ctx, grid, base + "out", outs, grid.problem.dims.head_dim,
                               HeadKind::query, bf16_out),
      casework::publish_tensor(ctx, grid, base + "lse", lses, 1, HeadKind::query, false)};
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

CaseResult run_case(const RunContext& ctx, const CaseSpec& spec) {
  const auto started = std::chrono::steady_clock::now();
  const TransportCounters before = ctx.transport.counters();
  const Problem& problem = ctx.problem;
  const int dim = problem.dims.head_dim;
  const bool bf16 = problem.dtype == DType::bf16;
  const CaseGrid grid(problem, spec);

  const std::vector<RankOutput> fp32 =
      run_protocol(grid, kFp32Path, ctx.transport, ctx.inputs, true);
  std::vector<RankOutput> dtype_runs;
  if (bf16) dtype_runs = run_protocol(grid, kBf16InputsPath, ctx.transport, ctx.inputs, false);
  const std::vector<RankOutput>& dtype = bf16 ? dtype_runs : fp32;
  const std::vector<RankOutput> kernel =
      run_protocol(grid, kBf16KernelPath, ctx.transport, ctx.inputs, false);
  // GPU runs: the cuBLAS unfused path, and the FP32 path again on the CPU backend.
  std::vector<RankOutput> unfused, cpu_fp32;
  if (ctx.inputs.backend().has_unfused_gemm())
    unfused = run_protocol(grid, kUnfusedPath, ctx.transport, ctx.inputs, false);
  if (ctx.cpu_check != nullptr)
    cpu_fp32 = run_protocol(grid, kFp32Path, ctx.transport, *ctx.cpu_check, false);

  const std::vector<Range> reference_grid{Range{0, problem.seq_len}};
  const std::vector<Range> counterpart_grid =
      kv_block_bounds(cp1_counterpart(spec), problem.seq_len);

  // Per hosted rank: the tensors every comparison reads, alive until the stats are done.
  struct RankTensors {
    AttnShard reference, counterpart, dtype_written, kernel_written, probe;
    OracleDiffs oracle;
    AttnShard unfused_written;  // GPU runs only
  };
  std::vector<RankTensors> tensors;
  tensors.reserve(fp32.size());
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    const ShardShape rows = fp32[i].merged.out.shape;
    tensors.push_back(
        RankTensors{ctx.cp1_results.get(ctx.inputs, kFp32Path, reference_grid, rows),
                    ctx.cp1_results.get(ctx.inputs, kFp32Path, counterpart_grid, rows),
                    final_write(dtype[i].merged, bf16), final_write(kernel[i].merged, true),
                    merge_reversed_arrivals(fp32[i], dim, ctx.inputs.backend()),
                    merge_oracle_diffs(fp32[i], dim),
                    unfused.empty() ? AttnShard{} : final_write(unfused[i].merged, true)});
  }

  Comparison cp_merge, dtype_path, bf16_kernel, topology, probe, oracle, unfused_drift, gpu_cpu;
  std::vector<const AttnShard*> ref_shards, fp32_shards, dtype_shards, kernel_shards,
      unfused_shards, cpu_shards;
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    const int r = fp32[i].rank.cp_rank;
    const RankTensors& t = tensors[i];
    cp_merge.add(r, fp32[i].merged, t.reference);
    dtype_path.add(r, t.dtype_written, t.reference);
    bf16_kernel.add(r, t.kernel_written, t.reference);
    topology.add(r, fp32[i].merged, t.counterpart);
    probe.add(r, t.probe, fp32[i].merged);
    oracle.add_diffs(r, t.oracle);
    if (!unfused.empty()) {
      unfused_drift.add(r, t.unfused_written, t.reference);
      unfused_shards.push_back(&t.unfused_written);
    }
    if (!cpu_fp32.empty()) {
      gpu_cpu.add(r, cpu_fp32[i].merged, fp32[i].merged);
      cpu_shards.push_back(&cpu_fp32[i].merged);
    }
    ref_shards.push_back(&t.reference);
    fp32_shards.push_back(&fp32[i].merged);
    dtype_shards.push_back(&t.dtype_written);
    kernel_shards.push_back(&t.kernel_written);
  }

  CaseResult result;
  result.spec = spec;
  result.name = case_name(spec, problem.dtype);
  result.cp_merge_fp32 = stats_pair(ctx, cp_merge);
  result.dtype_path = stats_pair(ctx, dtype_path);
  result.bf16_kernel = stats_pair(ctx, bf16_kernel);
  result.topology = stats_pair(ctx, topology);
  result.merge_probe = stats_pair(ctx, probe);
  result.merge_oracle = stats_pair(ctx, oracle);

  // Digests of every candidate (and, when dumping, the tensors themselves).
  if (ctx.dump_requested && ctx.dump != nullptr) {
    ctx.dump->annotate(
        "/cases/" + result.name,
        {{"tp_world_size", std::int64_t{spec.tp}},
         {"cp_world_size", std::int64_t{spec.cp}},
         {"split", spec.split ? DumpValue(*spec.split) : DumpValue(std::string("none"))},
         {"layout", std::string(to_string(spec.layout))},
         {"protocol", std::string(to_string(spec.protocol))}});
  }
  if (ctx.dump_requested) publish(ctx, grid, result.name, "reference_fp32", ref_shards, false);
  const Published fp32_digest =
      publish(ctx, grid, result.name, "candidate_fp32", fp32_shards, false);
  const Published dtype_digest =
      bf16 ? publish(ctx, grid, result.name, "candidate_bf16", dtype_shards, true) : fp32_digest;
  const Published kernel_digest =
      publish(ctx, grid, result.name, "bf16_kernel", kernel_shards, true);
  const auto set = [&](OutLseStats& s, const Published& p) {
    if (!ctx.collectives.root()) return;
    s.out.digest = p.out;
    s.lse.digest = p.lse;
  };
  set(result.cp_merge_fp32, fp32_digest);
  set(result.dtype_path, dtype_digest);
  set(result.bf16_kernel, kernel_digest);
  set(result.topology, fp32_digest);
  // Every process runs the same cases, so these are present everywhere or nowhere.
  if (!unfused.empty()) {
    result.cublas_unfused = stats_pair(ctx, unfused_drift);
    set(*result.cublas_unfused,
        publish(ctx, grid, result.name, "cublas_unfused", unfused_shards, true));
  }
  if (!cpu_fp32.empty()) {
    result.cuda_vs_cpu_fp32 = stats_pair(ctx, gpu_cpu);  // the CPU's bits vs the GPU's
    set(*result.cuda_vs_cpu_fp32, publish(ctx, grid, result.name, "cpu_fp32", cpu_shards, false));
  }

  result.topology_required = kv_block_bounds(spec, problem.seq_len) == counterpart_grid;
  result.topology_reference = case_name(cp1_counterpart(spec), problem.dtype);
  for (int r = 0; r < spec.cp; ++r) {
    PerRankDrift row;
    row.cp_rank = r;
    row.tokens = grid.at(0, r).tokens;
    row.candidate = {stats_of(ctx, dtype_path.out, r), stats_of(ctx, dtype_path.lse, r)};
    row.cp_merge = {stats_of(ctx, cp_merge.out, r), stats_of(ctx, cp_merge.lse, r)};
    result.per_rank.push_back(std::move(row));
  }
  if (ctx.cp1_backward != nullptr)
    result.backward = casework::measure_backward(ctx, grid, fp32, result.name);
  if (ctx.vocab_size > 0) {
    // Candidate: the case's CP output as written (BF16 under --dtype bf16); reference: the FP32
    // CP=1 output cast the same way.
    std::vector<AttnShard> cast;
    cast.reserve(tensors.size());
    for (const RankTensors& t : tensors) cast.push_back(final_write(t.reference, bf16));
    std::vector<const AttnShard*> cast_shards;
    for (const AttnShard& a : cast) cast_shards.push_back(&a);
    result.dlogp = casework::measure_dlogp(ctx, grid, dtype_shards, cast_shards, result.name);
  }

  // Which blocks each query owner merged, as it happened: counted on the hosting processes
  // and summed, so the report shows the real distributed run (the manifest checked it too).
  const std::size_t blocks = grid.blocks.size();
  std::vector<std::uint64_t> merged(static_cast<std::size_t>(spec.cp) * blocks, 0);
  for (const RankOutput& o : fp32) {
    if (o.rank.tp_rank != 0) continue;
    for (const Message& m : o.states) {
      ++merged[static_cast<std::size_t>(o.rank.cp_rank) * blocks +
               static_cast<std::size_t>(m.header.block_index)];
    }
  }
  ctx.collectives.sum(merged);
  result.merged_block_indices.assign(static_cast<std::size_t>(spec.cp), {});
  for (int r = 0; r < spec.cp; ++r) {
    for (std::size_t b = 0; b < blocks; ++b) {
      if (merged[static_cast<std::size_t>(r) * blocks + b] > 0) {
        result.merged_block_indices[static_cast<std::size_t>(r)].push_back(static_cast<int>(b));
      }
    }
  }
  result.processes_used = std::min(ctx.transport.world_size(), spec.num_logical_ranks());

  const TransportCounters& after = ctx.transport.counters();
  std::uint64_t moved[3] = {after.messages - before.messages, after.bytes - before.bytes,
                            after.remote_bytes - before.remote_bytes};
  ctx.collectives.sum(moved);
  result.moved = TransportCounters{moved[0], moved[1], moved[2]};
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

RopeDrift measure_rope_drift(const RunContext& ctx) {
  const Problem& p = ctx.problem;
  const int world = ctx.collectives.size(), me = ctx.collectives.rank();
  // Each process takes an equal slice of the positions; the stats combine exactly.
  const Range tokens{p.seq_len * me / world, p.seq_len * (me + 1) / world};
  RopeDrift drift;
  for (const TensorId t : {TensorId::q, TensorId::k}) {
    const int heads = t == TensorId::q ? p.dims.num_q_heads : p.dims.num_kv_heads;
    const ShardShape shape{p.batch, Range{0, heads}, {tokens}, p.dims.head_dim};
    const InputPrecision rounded =
        p.dtype == DType::bf16 ? InputPrecision::bf16 : InputPrecision::fp32;
    const Shard exact = ctx.inputs.shard(t, shape, InputPrecision::fp32);
    const Shard cast = ctx.inputs.shard(t, shape, rounded);
    const DiffPart part{cast.data.data(), exact.data.data(), cast.data.size()};
    DiffStats& s = t == TensorId::q ? drift.q : drift.k;
    s = compute_diff_stats(std::span<const DiffPart>(&part, 1), ctx.collectives, &ctx.pool);
    // Digest of the cast tensor in global order: (b, h) rows, each process's positions in turn.
    GlobalTensor g;
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < heads; ++h) {
        for (int proc = 0; proc < world; ++proc) {
          const Range slice{p.seq_len * proc / world, p.seq_len * (proc + 1) / world};
          if (slice.empty()) continue;
          g.pieces.push_back(GlobalPiece{b, h, slice, proc});
          g.segments.push_back(
              StreamSegment{proc, proc == me ? cast.at(b, h, 0) : nullptr,
                            static_cast<std::size_t>(slice.size() * p.dims.head_dim)});
        }
      }
    }
    const std::string digest = stream_digest(
        ctx.collectives, g, p.dtype == DType::bf16 ? DigestFormat::bf16 : DigestFormat::fp32);
    if (ctx.collectives.root()) s.digest = digest;
  }
  return drift;
}

}  // namespace cpd
