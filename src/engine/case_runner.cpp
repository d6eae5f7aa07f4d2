#include "cpdrift/engine/case_runner.h"

#include <chrono>
#include <optional>

#include "cpdrift/engine/merge_checks.h"
#include "cpdrift/metrics/digest.h"
#include "cpdrift/numerics/bf16.h"

namespace cpd {
namespace {

constexpr PathSpec kFp32Path{InputPrecision::fp32, ProbRounding::none};
constexpr PathSpec kBf16InputsPath{InputPrecision::bf16, ProbRounding::none};
constexpr PathSpec kBf16KernelPath{InputPrecision::bf16, ProbRounding::bf16};

// The BF16 final write: the output rounded once to BF16; lse stays FP32, as flash kernels
// keep it.
AttnShard final_write(const AttnShard& merged, bool bf16) {
  AttnShard written = merged;
  if (bf16) {
    for (float& x : written.out.data) x = round_bf16(x);
  }
  return written;
}

// Pieces of one comparison, each tagged with the CP rank whose query shard it belongs to.
struct TaggedPart {
  int cp_rank;
  DiffPart part;
};

struct Comparison {
  std::vector<TaggedPart> out, lse;
  std::vector<const Shard*> out_shards, lse_shards;  // the candidates, for digests
  DigestFormat out_format = DigestFormat::fp32;

  void add(int cp_rank, const AttnShard& candidate, const AttnShard& reference) {
    out.push_back(
        {cp_rank,
         {candidate.out.data.data(), reference.out.data.data(), candidate.out.data.size()}});
    lse.push_back(
        {cp_rank,
         {candidate.lse.data.data(), reference.lse.data.data(), candidate.lse.data.size()}});
    out_shards.push_back(&candidate.out);
    lse_shards.push_back(&candidate.lse);
  }
  void add_diffs(int cp_rank, const OracleDiffs& d) {
    out.push_back({cp_rank, {d.out.data(), nullptr, d.out.size()}});
    lse.push_back({cp_rank, {d.lse.data(), nullptr, d.lse.size()}});
  }
};

DiffStats stats_of(const RunContext& ctx, const std::vector<TaggedPart>& parts,
                   std::optional<int> only_cp_rank = std::nullopt) {
  std::vector<DiffPart> selected;
  for (const TaggedPart& p : parts) {
    if (!only_cp_rank || p.cp_rank == *only_cp_rank) selected.push_back(p.part);
  }
  return compute_diff_stats(selected, ctx.reducer, &ctx.pool);
}

OutLseStats global_stats(const RunContext& ctx, const Comparison& c, bool with_digest) {
  OutLseStats s{stats_of(ctx, c.out), stats_of(ctx, c.lse)};
  // Whole tensors are visible only when one process hosts every logical rank.
  if (with_digest && ctx.transport.world_size() == 1) {
    const ModelDims& dims = ctx.problem.dims;
    s.out.digest = global_digest(c.out_shards, dims.num_q_heads, ctx.problem.seq_len, c.out_format);
    s.lse.digest =
        global_digest(c.lse_shards, dims.num_q_heads, ctx.problem.seq_len, DigestFormat::fp32);
  }
  return s;
}

}  // namespace

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

  const std::vector<Range> reference_grid{Range{0, problem.seq_len}};
  const std::vector<Range> counterpart_grid =
      kv_block_bounds(cp1_counterpart(spec), problem.seq_len);

  // Per hosted rank: the tensors every comparison reads. Kept alive until the stats are done.
  struct RankTensors {
    AttnShard reference, counterpart, dtype_written, kernel_written, probe;
    OracleDiffs oracle;
  };
  std::vector<RankTensors> tensors;
  tensors.reserve(fp32.size());
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    const ShardShape rows = fp32[i].merged.out.shape;
    tensors.push_back(
        RankTensors{ctx.cp1_results.get(ctx.inputs, kFp32Path, reference_grid, rows),
                    ctx.cp1_results.get(ctx.inputs, kFp32Path, counterpart_grid, rows),
                    final_write(dtype[i].merged, bf16), final_write(kernel[i].merged, true),
                    merge_reversed_arrivals(fp32[i], dim), merge_oracle_diffs(fp32[i], dim)});
  }

  Comparison cp_merge, dtype_path, bf16_kernel, topology, probe, oracle;
  dtype_path.out_format = bf16 ? DigestFormat::bf16 : DigestFormat::fp32;
  bf16_kernel.out_format = DigestFormat::bf16;
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    const int r = fp32[i].rank.cp_rank;
    const RankTensors& t = tensors[i];
    cp_merge.add(r, fp32[i].merged, t.reference);
    dtype_path.add(r, t.dtype_written, t.reference);
    bf16_kernel.add(r, t.kernel_written, t.reference);
    topology.add(r, fp32[i].merged, t.counterpart);
    probe.add(r, t.probe, fp32[i].merged);
    oracle.add_diffs(r, t.oracle);
  }

  CaseResult result;
  result.spec = spec;
  result.name = case_name(spec, problem.dtype);
  result.cp_merge_fp32 = global_stats(ctx, cp_merge, true);
  result.dtype_path = global_stats(ctx, dtype_path, true);
  result.bf16_kernel = global_stats(ctx, bf16_kernel, true);
  result.topology = global_stats(ctx, topology, true);
  result.merge_probe = global_stats(ctx, probe, false);
  result.merge_oracle = global_stats(ctx, oracle, false);
  const CaseSpec counterpart = cp1_counterpart(spec);
  result.topology_required = kv_block_bounds(spec, problem.seq_len) == counterpart_grid;
  result.topology_reference = case_name(counterpart, problem.dtype);
  for (int r = 0; r < spec.cp; ++r) {
    PerRankDrift row;
    row.cp_rank = r;
    row.tokens = grid.at(0, r).tokens;
    row.candidate = {stats_of(ctx, dtype_path.out, r), stats_of(ctx, dtype_path.lse, r)};
    row.cp_merge = {stats_of(ctx, cp_merge.out, r), stats_of(ctx, cp_merge.lse, r)};
    result.per_rank.push_back(std::move(row));
  }
  const TransportCounters& after = ctx.transport.counters();
  result.moved = TransportCounters{after.messages - before.messages, after.bytes - before.bytes,
                                   after.remote_bytes - before.remote_bytes};
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

RopeDrift measure_rope_drift(const RunContext& ctx) {
  const Problem& p = ctx.problem;
  const int world = ctx.transport.world_size(), me = ctx.transport.process_index();
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
    DiffStats s = compute_diff_stats(std::span<const DiffPart>(&part, 1), ctx.reducer, &ctx.pool);
    if (world == 1) {
      const Shard* shards[] = {&cast};
      s.digest = global_digest(shards, heads, p.seq_len,
                               p.dtype == DType::bf16 ? DigestFormat::bf16 : DigestFormat::fp32);
    }
    (t == TensorId::q ? drift.q : drift.k) = s;
  }
  return drift;
}

}  // namespace cpd
