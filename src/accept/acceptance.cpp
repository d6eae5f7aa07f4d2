#include "accept/acceptance.h"

#include <iterator>

namespace cpd {

using json::Value;

namespace {

// The evidence's cases: one source for the rows' names and for the run that produces them.
CaseSpec evidence_case(std::optional<std::int64_t> split, Protocol protocol) {
  return CaseSpec{2, 2, split, CpLayout::contiguous, protocol};
}
constexpr std::int64_t kEvidenceSplit = 4;
constexpr Protocol kProtocols[] = {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv};

std::string evidence_name(const Problem& problem, std::optional<std::int64_t> split,
                          Protocol protocol = Protocol::ag_rs) {
  return case_name(evidence_case(split, protocol), problem);
}

PagedCaseSpec evidence_paged(PagedMode mode, SplitPolicy policy) {
  return PagedCaseSpec{mode, SplitKv{policy, policy == SplitPolicy::fixed ? kAcceptFixedSplit : 0}};
}

}  // namespace

RunRequest evidence_request(const Problem& problem, int threads, bool with_cp) {
  RunRequest r;
  r.problem = problem;
  r.problem.dtype = DType::bf16;
  r.tp_sizes = {evidence_case(std::nullopt, Protocol::ag_rs).tp};
  r.cp_sizes = {evidence_case(std::nullopt, Protocol::ag_rs).cp};
  r.splits = {std::nullopt, kEvidenceSplit, kAcceptFixedSplit};
  r.protocols.assign(std::begin(kProtocols), std::end(kProtocols));
  r.modes = {RunMode::paged_prefill, RunMode::decode};
  if (with_cp) r.modes.insert(r.modes.begin(), {RunMode::prefill, RunMode::chunked_prefill});
  r.page_size = kAcceptPageSize;
  r.split_policies = {SplitPolicy::disabled, SplitPolicy::fixed};
  r.fixed_split_size = kAcceptFixedSplit;
  r.include_backward = true;
  r.include_dlogp = true;
  r.threads = threads;
  return r;
}

std::vector<AcceptanceRow> required_matrix(const ModelDims& model) {
  Problem problem;  // the evidence's: the model's BF16 cases
  problem.dims = model;
  problem.dtype = DType::bf16;
  using K = AcceptanceRow::Kind;
  std::vector<AcceptanceRow> rows;
  const std::string prefill = evidence_name(problem, std::nullopt),
                    chunked = evidence_name(problem, kEvidenceSplit);
  rows.push_back({.name = prefill,
                  .kind = K::distributed_case,
                  .processes = 4,
                  .cases = {prefill},
                  .backward_and_dlogp = true});
  rows.push_back({.name = chunked,
                  .kind = K::distributed_case,
                  .processes = 4,
                  .cases = {chunked},
                  .backward_and_dlogp = true,
                  .bitwise_topology = true});
  std::vector<std::string> protocols;
  for (const Protocol p : kProtocols)
    protocols.push_back(evidence_name(problem, kEvidenceSplit, p));
  rows.push_back({.name = "cp_protocol_equivalence_tp2_cp2_chunk" + std::to_string(kEvidenceSplit),
                  .kind = K::protocol_equivalence,
                  .processes = 4,
                  .cases = protocols,
                  .bitwise_topology = true});
  // Paged rows read the paged cases of the acceptance run (kAcceptPageSize, kAcceptFixedSplit);
  // any job size runs them.
  std::vector<std::string> paged_cases;
  for (const PagedMode mode : {PagedMode::paged_prefill, PagedMode::decode}) {
    for (const SplitPolicy split : {SplitPolicy::disabled, SplitPolicy::fixed}) {
      const std::string name = paged_case_name(evidence_paged(mode, split), problem);
      paged_cases.push_back(name);
      rows.push_back({.name = (mode == PagedMode::decode ? "paged_decode" : "paged_prefill") +
                              std::string("_split_kv_") + to_string(split),
                      .kind = K::paged_case,
                      .processes = 1,
                      .cases = {name}});
    }
  }
  rows.push_back({.name = "batch_invariance_paged",
                  .kind = K::paged_invariance,
                  .processes = 1,
                  .cases = paged_cases,
                  .invariance = "batch_composition"});
  rows.push_back({.name = "page_layout_invariance",
                  .kind = K::paged_invariance,
                  .processes = 1,
                  .cases = paged_cases,
                  .invariance = "page_layout"});
  // The trainer's layout against the rollout's with the same split: their bits must be equal.
  const std::string trainer = evidence_name(problem, kAcceptFixedSplit);
  const std::string rollout =
      paged_case_name(evidence_paged(PagedMode::decode, SplitPolicy::fixed), problem);
  rows.push_back({.name = "trainer_vs_rollout_aligned_tp2_cp2_chunk" +
                          std::to_string(kAcceptFixedSplit) + "_vs_decode_fixed" +
                          std::to_string(kAcceptFixedSplit),
                  .kind = K::rollout_pair,
                  .processes = 4,
                  .cases = {trainer, rollout}});
  for (int np : {2, 4, 8}) {
    const std::string why =
        "accept does not run the GPU transports yet, so there is no executed evidence (one GPU per "
        "process)";
    rows.push_back({.name = "p2p_nccl_reference_np" + std::to_string(np),
                    .kind = K::not_yet_available,
                    .processes = np,
                    .unavailable_reason = "NCCL transport: " + why});
    rows.push_back({.name = "custom_cuda_ag_rs_np" + std::to_string(np),
                    .kind = K::not_yet_available,
                    .processes = np,
                    .unavailable_reason = "CUDA-IPC all-gather/reduce-scatter: " + why});
  }
  return rows;
}

RowVerdict row_verdict(const AcceptanceRow& row) {
  RowVerdict v{row.name, row.required};
  v.evidence["cases"] = json::Array(row.cases.begin(), row.cases.end());
  return v;
}

RowVerdict manifest_row(const AcceptanceRow& row) {
  RowVerdict v = row_verdict(row);
  const bool unavailable = row.kind == AcceptanceRow::Kind::not_yet_available;
  v.status = unavailable ? "unavailable" : "not_run";
  v.errors.push_back(unavailable ? row.unavailable_reason : "manifest mode executes nothing");
  return v;
}

Value acceptance_json(const std::string& mode, const std::vector<RowVerdict>& rows,
                      const Thresholds& t, const Value& runtime, const std::string& created_at) {
  json::Array matrix, cases, failed;
  for (const RowVerdict& r : rows) {
    if (r.required) matrix.push_back(r.name);
    if (r.required && !r.passed()) failed.push_back(r.name);
    cases.push_back(json::Object{{"name", r.name},
                                 {"required", r.required},
                                 {"status", r.status},
                                 {"passed", r.passed()},
                                 {"errors", json::Array(r.errors.begin(), r.errors.end())},
                                 {"evidence", r.evidence}});
  }
  // Manifest mode executes nothing, so it can never pass.
  const bool passed = failed.empty() && mode == "run";
  return json::Object{{"schema_version", kAcceptanceSchema},
                      {"issue", 235},
                      {"created_at_utc", created_at},
                      {"mode", mode},
                      {"runtime", runtime},
                      {"thresholds", thresholds_json(t)},
                      {"required_matrix", std::move(matrix)},
                      {"cases", std::move(cases)},
                      {"failed_required_cases", std::move(failed)},
                      {"passed", passed},
                      {"status", passed ? "passed" : "failed"}};
}

}  // namespace cpd
