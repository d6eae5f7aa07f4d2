// What the layer's own phases hold at their high-water on each process (--scope layer): o_proj
// and the layer's backward (the layer's dlogp is dlogp's, phase_memory.cpp).
#include <algorithm>

#include "cpdrift/tp_lanes.h"
#include "engine/layer_backward.h"
#include "engine/layer_backward_parts.h"
#include "engine/memory_plan.h"
#include "engine/phase_memory_util.h"

namespace cpd::phase_memory {

using namespace phase_memory_util;

// The layer's o_proj, a chunk of tokens a step (layer_chain): per hosted rank the plane it folds
// into and sends on and the one it receives (the owner also the one it copies out; a continuing
// rank under rank_sums its own sum too), [2 + TP][B][rows][hidden] each; the chunk's group rows
// and the CPU tile's transposed copy of them; the owners' layer outputs and TP-reduction lanes.
// o_proj's columns of the ranks' head groups stay in the input store for the run (the memos).
void o_proj(CaseMemory& m) {
  const Problem& p = m.problem();
  const TpChain chain = layer_chain(m.grid());
  const std::uint64_t hidden = u64(p.dims.hidden_size), batch = u64(p.batch);
  const std::uint64_t extra = p.o_proj_order == OProjOrder::rank_sums ? 1 : 0;
  for (std::size_t proc = 0; proc < m.processes(); ++proc) {
    std::uint64_t planes = 0, rows = 0, outputs = 0;
    for (const LogicalRank* r : m.hosted(proc)) {
      std::uint64_t chunk = 0;
      for (const Range& c : chain_chunks(chain, *r)) chunk = std::max(chunk, u64(c.size()));
      const std::uint64_t plane = u64(chain.planes) * batch * chunk * hidden * kFloat;
      planes += (r->tp_rank == 0 ? 3 : 2 + extra) * plane;
      rows = std::max(
          rows, 2 * 2 * batch * u64(r->q_heads.size()) * chunk * u64(p.dims.head_dim) * kFloat);
      std::uint64_t tokens = 0;
      for (const Range& t : r->tokens) tokens += u64(t.size());
      // The canonical output and the reference's, and the trainer's TP-reduction lanes'.
      if (r->tp_rank == 0)
        outputs += (2 + kTrainerTpLanes.size()) * batch * tokens * hidden * kFloat;
      for (std::int64_t h = r->q_heads.begin; h < r->q_heads.end; ++h)
        m.memos(proc).o_proj_groups.insert(h / p.dims.group_size());
    }
    m.add_phase(proc, kOProjPhase,
                {{"references", m.references(proc)},
                 {"outputs kept", m.kept(proc)},
                 {"references cast as written", m.references(proc)},
                 {"one step's layer planes", planes},
                 {"a chunk's group rows, and transposed", rows},
                 {"the layer outputs", outputs}});
  }
}

// The layer's backward (layer_backward.h), at its widest: the FP32 output and the references
// (o_proj's gradient reads their attention output), both gradients (dq and dk made over into dP
// in place); the weight gradients on the token chains' holder; first the token chains' rows —
// the pre-norm q rows, then the layer input's, then the output gradient's, each in the last's
// place — and a step's pieces; then, on the token owners, dX and the dX chain's planes and a
// chunk's group rows. The transposed weights stay in the store (the memos).
void layer_backward(CaseMemory& m) {
  const Problem& p = m.problem();
  const CaseGrid& grid = m.grid();
  const std::uint64_t hidden = u64(p.dims.hidden_size), batch = u64(p.batch);
  const std::uint64_t dim = u64(p.dims.head_dim), group = u64(p.dims.group_size());
  const TokenChain qkv = layer_qkv_chain(grid), o = layer_o_chain(grid);
  const int holder = token_chain_holder(grid);
  const std::vector<TokenStage> stages = token_stages(grid);
  for (std::size_t proc = 0; proc < m.processes(); ++proc) {
    std::uint64_t chains = 0, dx = 0, weights = 0;
    for (const LogicalRank* r : m.hosted(proc)) {
      const std::uint64_t tokens = u64(rows_of(r->tokens));
      const std::uint64_t pre = p.dims.qk_norm ? sizes_of(p, *r).q : 0;
      std::uint64_t mine = 0;  // the rank's stages: each a piece received and one sent a step
      for (const TokenStage& s : stages) mine += s.cp_rank == r->cp_rank ? 1 : 0;
      chains += std::max(pre, batch * tokens * std::max(u64(qkv.inputs), hidden) * kFloat) +
                2 * mine * u64(qkv.planes) * u64(qkv.piece_rows) * u64(qkv.inputs) * kFloat;
      if (r->cp_rank == holder)  // candidate, reference and the gradient lanes
        weights += u64(layer_backward_parts::weight_planes(grid)) *
                   (u64(qkv.outputs) * u64(qkv.inputs) + u64(o.outputs) * u64(o.inputs)) * kFloat;
      std::uint64_t chunk = 0;
      for (const Range& c : chain_chunks(layer_chain(grid), *r))
        chunk = std::max(chunk, u64(c.size()));
      const std::uint64_t owned = 2 + (p.reduction_lanes ? kTrainerTpLanes.size() : 0);  // + lanes
      dx += (r->tp_rank == 0 ? owned * batch * tokens * hidden * kFloat : 0) +
            (r->tp_rank == 0 ? 3 : 2) * u64(layer_chain(grid).planes) * batch * chunk * hidden *
                kFloat +
            2 * batch * u64(r->kv_heads.size()) * chunk * (group + 2) * dim * kFloat;
      for (std::int64_t g = r->kv_heads.begin; g < r->kv_heads.end; ++g)
        m.memos(proc).qkv_transposed.insert(g);
    }
    const std::uint64_t gradients =
        each(m, proc, [](const LogicalRank&, RankSizes s) { return s.q + 2 * s.kv; });
    m.add_phase(proc, kLayerBackwardPhase,
                {{"FP32 output kept", m.references(proc)},
                 {"references (their attention output)", m.references(proc)},
                 {"gradients and reference gradients (dq, dk made dP in place)", 2 * gradients},
                 {"weight gradients", weights},
                 {"the token chains' rows and pieces, then dX, its planes and group rows",
                  std::max(chains, dx)}});
  }
}

}  // namespace cpd::phase_memory
