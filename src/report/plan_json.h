// The writers of the report's sections that its files share: a case's topology and provenance
// (split plans, plan set, RoPE), its training and logprob legs, and the small common shapes.
#pragma once

#include <vector>

#include "core/plan.h"
#include "report/rl_metrics_json.h"
#include "report/run_report.h"

namespace cpd {

/// `figure` when every diff of `s` was finite, else null (JSON has no NaN).
/// transformers' rope_scaling object of `rope` (rope_type, factor, …), null for none.
json::Value rope_scaling_json(const RopeSpec& rope);

json::Value finite_or_null(const DiffStats& s, double figure);
/// {status, reason}: a section that was not produced, and why.
json::Value status_json(const char* status, const char* reason);

/// The dtype as PyTorch names it ("bfloat16", "float32"): the reference's spelling in its
/// dtype fields.
const char* torch_dtype_name(DType dtype);

json::Value topology_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e,
                          const Provenance& pv);
json::Value case_provenance_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e,
                                 const Provenance& pv);

/// The split plan (report contract, "A split plan") of every CP owner, in owner order, as
/// `executed` (one TP rank's blocks, from the messages its query owners folded) ran it, named
/// `split_kv_backend`.
json::Value owner_plans_json(const Problem& p, const CaseSpec& spec,
                             const std::string& split_kv_backend,
                             const std::vector<ExecutedBlock>& executed);
/// The split_kv_backend of the backward's plans: cpdrift's block grid on the backend that ran.
std::string backward_split_backend(const CaseExecution& e);
/// The plan set: one entry per (batch_index, tp_rank, cp_rank, owner_cp_rank), each the plan of
/// its TP rank as executed.
json::Value plan_set_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e);

/// The training and logprob legs: a case's `backward`, `layer` and `dlogp`, the root `dlogp`, and
/// the report's `trainer_vs_rollout` block (how the pairs are made, and one entry per pair).
json::Value backward_json(const RunReport& r, const CaseResult& c);
json::Value layer_case_json(const RunReport& r, const CaseResult& c);
/// The layer's TP-reduction lanes (numerics.md §12): each lane's upstream, collective and drift.
json::Value tp_lanes_json(const std::vector<TpLaneDrift>& lanes);
json::Value dlogp_case_json(const CaseResult& c, const Problem& p);
json::Value dlogp_root_json(const RunReport& r);
json::Value rollout_pairs_json(const RunReport& r);

}  // namespace cpd
