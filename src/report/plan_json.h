// JSON for a case's topology and provenance (split plans, plan set, RoPE), and the root
// launch/runtime blocks.
#pragma once

#include <vector>

#include "core/plan.h"
#include "report/run_report.h"

namespace cpd {

/// The dtype as PyTorch names it ("bfloat16", "float32"): the reference's spelling in its
/// dtype fields.
const char* torch_dtype_name(DType dtype);

json::Value ranges_json(const std::vector<Range>& ranges);
json::Value topology_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e,
                          const Provenance& pv);
json::Value case_provenance_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e,
                                 const Provenance& pv);

/// The split plan of CP owner `owner` (report contract, "A split plan") as `executed` (one TP
/// rank's blocks, from the messages its query owners folded) ran it, named `split_kv_backend`.
json::Value split_plan_json(const Problem& p, const CaseSpec& spec,
                            const std::string& split_kv_backend,
                            const std::vector<ExecutedBlock>& executed, int owner);
/// The split_kv_backend of the forward's and the backward's plans: cpdrift's block grid on the
/// backend that ran.
std::string forward_split_backend(const CaseExecution& e);
std::string backward_split_backend(const CaseExecution& e);
/// The plan set: one entry per (batch_index, tp_rank, cp_rank, owner_cp_rank), each the plan of
/// its TP rank as executed.
json::Value plan_set_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e);

}  // namespace cpd
