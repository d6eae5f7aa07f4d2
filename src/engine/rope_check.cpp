// The run's RoPE check: Q and K after RoPE as the candidate dtype rounds them, vs FP32.
#include "engine/case_runner.h"
#include "kernels/attention_backend.h"

namespace cpd {

void run_rope_check(const RunContext& ctx, CaseSink& sink) {
  const Problem& p = ctx.problem;
  const int world = ctx.collectives.size(), me = ctx.collectives.rank();
  const auto slice = [&](int proc) {
    return Range{p.seq_len * proc / world, p.seq_len * (proc + 1) / world};
  };
  // Each process takes an equal slice of the positions; the statistics combine exactly.
  const Range tokens = slice(me);
  const bool bf16 = p.dtype == DType::bf16;
  RopeOutputs o;
  for (const TensorId t : {TensorId::q, TensorId::k}) {
    const int heads = heads_of(p.dims, t);
    const ShardShape shape{p.batch, Range{0, heads}, {tokens}, p.dims.head_dim};
    // Generated here rather than through the input memo: these rows are every head's, at
    // positions unrelated to the cases' shards, and the memo would hold them all run.
    AttentionBackend& backend = ctx.inputs.backend();
    const Shard& exact = o.held.keep(backend.generate_shard(p, t, shape, InputPrecision::fp32));
    const Shard& cast = o.held.keep(bf16 ? bf16_written(exact, ctx.pool) : Shard(exact));
    Comparison& c = t == TensorId::q ? o.q : o.k;
    c.add(0, cast, exact);
    c.candidate_tensor = static_cast<int>(o.tensors.size());
    // The cast tensor in global order: (b, h) rows, each process's positions in turn.
    CaseTensor& tensor = o.tensors.emplace_back();
    tensor.bf16 = bf16;
    GlobalTensor& g = tensor.layout =
        GlobalTensor{p.batch, heads, p.seq_len, p.dims.head_dim, {}, {}};
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < heads; ++h) {
        for (int proc = 0; proc < world; ++proc) {
          if (!slice(proc).empty())
            g.add(GlobalPiece{b, h, slice(proc), proc}, proc == me ? cast.at(b, h, 0) : nullptr);
        }
      }
    }
  }
  sink.rope(o);
}

}  // namespace cpd
