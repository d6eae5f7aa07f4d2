// The layer's phases (--scope layer): o_proj of the case's attention output and of the reference,
// compared and published.
#include "cpdrift/bf16.h"
#include "engine/case_run.h"
#include "engine/case_runner.h"
#include "engine/layer_backward.h"
#include "engine/o_proj.h"
#include "engine/tensor_layout.h"

namespace cpd {
namespace phase_run {

void o_proj(CaseRun& r) {
  // As dlogp: the case's CP output as written (BF16 under --dtype bf16) vs the FP32 CP=1 output
  // cast the same way; the layer's output is written alike (a BF16 model's o_proj writes BF16).
  const bool bf16 = r.ctx.problem.dtype == DType::bf16;
  std::vector<AttnShard> cast;
  for (const AttnShard* a : r.reference) cast.push_back(final_write(*a, bf16, r.ctx.pool));
  HostedAttention cast_of;
  for (const AttnShard& c : cast) cast_of.push_back(&c);
  CasePart part(r.grid.spec.cp);
  Comparison& c = part.layer.emplace();
  std::vector<const Shard*> candidate, reference;
  // Kept in the run: dlogp reads it.
  r.layer = run_o_proj(r.grid, r.dtype_written, cast_of, r.ctx.transport, r.ctx.inputs);
  for (LayerOutputs& o : r.layer) {
    if (bf16) {
      write_bf16_in_place(o.candidate, r.ctx.pool);
      write_bf16_in_place(o.reference, r.ctx.pool);
    }
    c.add(o.rank.cp_rank, o.candidate, o.reference);
    candidate.push_back(&o.candidate);
    reference.push_back(&o.reference);
  }
  // [B, 1, S, hidden] on the token owners: TP rank 0 of each CP rank.
  const std::string base = case_group(r.record.name) + "/layer/";
  const int hidden = r.grid.problem.dims.hidden_size;
  c.candidate_tensor = static_cast<int>(part.tensors.size());
  part.tensors.push_back(case_tensor(r.grid, r.ctx.transport, base + "candidate/out", candidate,
                                     hidden, HeadKind::token, bf16, true));
  part.tensors.push_back(case_tensor(r.grid, r.ctx.transport, base + "reference/out", reference,
                                     hidden, HeadKind::token, bf16, false));
  // The TP-reduction lanes: already in the model's dtype (their collective's wire type).
  for (std::size_t k = 0; k < (r.ctx.problem.reduction_lanes ? kTrainerTpLanes.size() : 0); ++k) {
    TpLaneComparisons& lane =
        part.tp_lanes.emplace_back(TpLaneComparisons{kTrainerTpLanes[k], "out", {}, {}});
    std::vector<const Shard*> rows;
    for (LayerOutputs& o : r.layer) {
      lane.vs_reference.add(o.rank.cp_rank, o.tp_lanes[k], o.reference);
      lane.vs_canonical.add(o.rank.cp_rank, o.tp_lanes[k], o.candidate);
      rows.push_back(&o.tp_lanes[k]);
    }
    lane.vs_reference.candidate_tensor = static_cast<int>(part.tensors.size());
    part.tensors.push_back(case_tensor(r.grid, r.ctx.transport,
                                       base + "tp_lanes/" + to_string(kTrainerTpLanes[k]), rows,
                                       hidden, HeadKind::token, bf16, true));
  }
  r.sink.prefill_part(part);
}

// A gradient's reduction lanes (numerics.md §12: dX's over TP, Megatron's column-parallel
// backward; the weights' over DP × CP, its distributed optimizer's reduce-scatter): each lane vs
// the reference's gradient, and vs the canonical gradient written in the lane's wire type (dX:
// the run's dtype, a BF16 model's dgrad GEMM writes BF16; a weight: the lane's own); published
// beside the gradient, `t` its tensor's layout.
void add_lanes(const Problem& p, const LayerGradient& g, CaseTensor t, const std::string& base,
               HeldTensors& written, CasePart& part) {
  for (std::size_t k = 0; k < g.lanes.size(); ++k) {
    const TpLane id = g.lanes[k];
    const bool bf16 = id == TpLane::megatron_grad_bf16 ||
                      (id != TpLane::megatron_grad_fp32 && p.dtype == DType::bf16);
    TpLaneComparisons& lane = part.tp_lanes.emplace_back(TpLaneComparisons{id, g.name, {}, {}});
    for (std::size_t j = 0; j < g.hosted.size(); ++j) {
      const LayerGradient::Hosted& h = g.hosted[j];
      const float* mine = g.tp_lanes[j][k];
      lane.vs_reference.add(0, mine, h.reference, h.count, bf16);
      const float* canonical = h.candidate;
      if (bf16) {
        std::vector<float> rounded(h.candidate, h.candidate + h.count);
        for (float& x : rounded) x = round_bf16(x);
        canonical = written.keep(std::move(rounded)).data();
      }
      lane.vs_canonical.add(0, mine, canonical, h.count, bf16);
    }
    std::size_t j = 0;
    for (StreamSegment& s : t.layout.segments) {
      if (s.data != nullptr) s.data = g.tp_lanes[j++][k];
    }
    t.path = base + "tp_lanes/" + to_string(id) + "/" + g.name;
    t.digest = true;
    t.bf16 = bf16;
    lane.vs_reference.candidate_tensor = static_cast<int>(part.tensors.size());
    part.tensors.push_back(t);
  }
}

void layer_backward(CaseRun& r) {
  // The core's gradients as the backward published them (kept in the run for this phase); dq and
  // dk are made over in place.
  std::vector<LayerBackwardInputs> inputs;
  for (std::size_t i = 0; i < r.gradients.size(); ++i) {
    RankGradients& c = r.gradients[i];
    LocalCp1Backward::Result& ref = r.reference_gradients[i];
    inputs.push_back(LayerBackwardInputs{{&c.dq, &ref.dq},
                                         {&c.dk, &ref.dk},
                                         {&c.dv, &ref.dv},
                                         {&r.fp32[i].merged.out, &r.reference[i]->out}});
  }
  // Kept while the part is measured and published: its pieces point into them.
  const std::vector<LayerGradient> layer =
      run_layer_backward(r.grid, inputs, r.ctx.transport, r.ctx.collectives, r.ctx.inputs);
  r.gradients.clear();
  r.reference_gradients.clear();
  r.release_references();
  CasePart part(r.grid.spec.cp);
  HeldTensors written;  // dX's canonical BF16 write, which its lanes are compared with
  const std::string base = case_group(r.record.name) + "/layer_backward/";
  for (const LayerGradient& g : layer) {
    Comparison& c = part.layer_backward.emplace_back(g.name, Comparison{}).second;
    for (const LayerGradient::Hosted& h : g.hosted) c.add(0, h.candidate, h.reference, h.count);
    c.candidate_tensor = static_cast<int>(part.tensors.size());
    CaseTensor t{base + "candidate/" + g.name, true, false, g.layout, {{"shape", g.shape}}};
    part.tensors.push_back(t);
    // The reference's: the same pieces, its data where hosted.
    std::size_t k = 0;
    for (StreamSegment& s : t.layout.segments) {
      if (s.data != nullptr) s.data = g.hosted[k++].reference;
    }
    t.path = base + "reference/" + g.name;
    t.digest = false;
    part.tensors.push_back(t);
    if (!g.lanes.empty()) add_lanes(r.ctx.problem, g, t, base, written, part);
  }
  r.sink.prefill_part(part);
}

}  // namespace phase_run
}  // namespace cpd
