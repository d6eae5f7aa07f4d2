#include "accept/acceptance.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

namespace cpd {

using json::Value;

namespace {

// The evidence's cases: one source for the rows' names and for the run that produces them.
CaseSpec evidence_case(std::optional<std::int64_t> split, Protocol protocol) {
  return CaseSpec{2, 2, split, CpLayout::contiguous, protocol};
}
constexpr std::int64_t kEvidenceSplit = 4;
constexpr Protocol kProtocols[] = {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv};

std::string evidence_name(std::optional<std::int64_t> split, Protocol protocol = Protocol::ag_rs) {
  return case_name(evidence_case(split, protocol), DType::bf16);
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

std::vector<AcceptanceRow> required_matrix() {
  using K = AcceptanceRow::Kind;
  std::vector<AcceptanceRow> rows;
  const std::string prefill = evidence_name(std::nullopt), chunked = evidence_name(kEvidenceSplit);
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
  for (const Protocol p : kProtocols) protocols.push_back(evidence_name(kEvidenceSplit, p));
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
      const std::string name = paged_case_name(evidence_paged(mode, split), DType::bf16);
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
  const std::string trainer = evidence_name(kAcceptFixedSplit);
  const std::string rollout =
      paged_case_name(evidence_paged(PagedMode::decode, SplitPolicy::fixed), DType::bf16);
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

namespace {

// Follows a dotted path; nullptr where anything is missing.
const Value* at_path(const Value& root, const std::string& path) {
  const Value* v = &root;
  std::stringstream ss(path);
  std::string key;
  while (std::getline(ss, key, '.')) {
    if (!key.empty() && std::all_of(key.begin(), key.end(), ::isdigit)) {
      const std::size_t i = std::stoul(key);
      if (!v->is_array() || i >= v->size()) return nullptr;
      v = &v->at(i);
    } else {
      if (!v->is_object() || !v->contains(key)) return nullptr;
      v = &v->at(key);
    }
  }
  return v;
}

// A metric the row needs, through the one gate (metrics/gates.h): present, a number (the report
// writes non-finite metrics as null), non-negative, within `limit`. Records the value.
void check_metric(const Value& c, const std::string& path, double limit, RowVerdict& v,
                  const std::string& label) {
  const Value* m = at_path(c, path);
  std::optional<double> value;
  if (m != nullptr) value = m->is_number() ? m->as_double() : std::nan("");
  if (value && std::isfinite(*value)) v.evidence["metrics"][label + path] = *value;
  if (std::string why = gate_failure(label + path, value, limit); !why.empty())
    v.errors.push_back(std::move(why));
}

// Every executed plan (per owner, and per entry of the plan set: every TP rank's) ran as
// requested, with no fallback.
void check_split_plans(const Value& c, RowVerdict& v) {
  const Value* requested = at_path(c, "provenance.requested_split_kv_policy");
  const Value* size = at_path(c, "provenance.requested_split_kv_size");
  const Value* plans = at_path(c, "provenance.actual_split_kv_plans");
  if (requested == nullptr || size == nullptr || plans == nullptr || !plans->is_array() ||
      plans->size() == 0) {
    v.errors.push_back("missing split plans");
    return;
  }
  std::vector<const Value*> all;
  for (const Value& p : plans->as_array()) all.push_back(&p);
  if (const Value* e = at_path(c, "provenance.actual_split_kv_plan_set.entries");
      e != nullptr && e->is_array()) {  // its absence is check_plan_set's to report
    for (const Value& p : e->as_array()) all.push_back(&p);
  }
  for (const Value* plan : all) {
    const Value& p = *plan;
    const Value* policy = at_path(p, "actual_split_kv_policy");
    const Value* actual = at_path(p, "actual_split_kv_size");
    const Value* fallback = at_path(p, "split_kv_fallback");
    const bool ran_as_requested = policy != nullptr && *policy == *requested && actual != nullptr &&
                                  *actual == *size && fallback != nullptr && fallback->is_bool() &&
                                  !fallback->as_bool();
    if (!ran_as_requested) {
      v.errors.push_back("split plan requested (" + json::to_string(*requested, false) + ", " +
                         json::to_string(*size, false) + ") but not run as requested");
      return;
    }
  }
}

void check_plan_set(const Value& c, RowVerdict& v) {
  const Value* set = at_path(c, "provenance.actual_split_kv_plan_set");
  const auto fail = [&](const std::string& why) {
    v.errors.push_back("incomplete plan-set coverage: " + why);
  };
  if (set == nullptr || !set->is_object()) return fail("no plan set");
  const Value* b = at_path(*set, "batch_size");
  const Value* tp = at_path(*set, "tp_world_size");
  const Value* cp = at_path(*set, "cp_world_size");
  const Value* entries = at_path(*set, "entries");
  const Value* coverage = at_path(*set, "coverage");
  const Value* totals = at_path(*set, "total_kv_tokens");
  if (!b || !tp || !cp || !entries || !coverage || !totals || !b->is_integer() ||
      !tp->is_integer() || !cp->is_integer() || !entries->is_array() || !totals->is_array()) {
    return fail("fields missing");
  }
  if (!coverage->is_string() ||
      coverage->as_string() != "complete_batch_tp_cp_owner_cartesian_product") {
    return fail("coverage is not the complete cartesian product");
  }
  const std::int64_t want = b->as_int64() * tp->as_int64() * cp->as_int64() * cp->as_int64();
  if (static_cast<std::int64_t>(entries->size()) != want) {
    return fail(std::to_string(entries->size()) + " entries, B·TP·CP·CP = " + std::to_string(want));
  }
  // For each (batch, tp, cp) the owners' ranges must tile [0, S).
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>,
           std::vector<std::pair<std::int64_t, std::int64_t>>>
      tiles;
  for (const Value& e : entries->as_array()) {
    const Value* ranges = at_path(e, "expected_kv_ranges");
    const Value* bi = at_path(e, "batch_index");
    const Value* ti = at_path(e, "tp_rank");
    const Value* ri = at_path(e, "cp_rank");
    if (!ranges || !ranges->is_array() || !bi || !ti || !ri)
      return fail("an entry lacks its ranges");
    for (const Value& r : ranges->as_array()) {
      if (!r.is_array() || r.size() != 2) return fail("a malformed range");
      tiles[{bi->as_int64(), ti->as_int64(), ri->as_int64()}].emplace_back(r.at(0).as_int64(),
                                                                           r.at(1).as_int64());
    }
  }
  for (auto& [key, ranges] : tiles) {
    std::sort(ranges.begin(), ranges.end());
    const std::size_t batch = static_cast<std::size_t>(std::get<0>(key));
    if (batch >= totals->size()) return fail("batch index out of range");
    std::int64_t next = 0;
    for (const auto& [s, e] : ranges) {
      if (s != next) return fail("owner ranges leave a gap or overlap at " + std::to_string(next));
      next = e;
    }
    if (next != totals->at(batch).as_int64())
      return fail("owner ranges end at " + std::to_string(next));
  }
  if (static_cast<std::int64_t>(tiles.size()) != b->as_int64() * tp->as_int64() * cp->as_int64()) {
    return fail("some (batch, tp, cp) has no entries");
  }
}

void check_transport(const Value& c, int processes, RowVerdict& v) {
  const Value* p2p = at_path(c, "distributed_p2p_reference");
  const Value* status = p2p ? at_path(*p2p, "status") : nullptr;
  if (status == nullptr || !status->is_string() || status->as_string() != "available") {
    v.errors.push_back(
        "emulated transport: no real distributed run (distributed_p2p_reference not available)");
    return;
  }
  const Value* transport = at_path(*p2p, "transport");
  const Value* used = at_path(*p2p, "processes_used");
  const bool real = transport && transport->is_string() &&
                    (transport->as_string() == "mpi" || transport->as_string() == "nccl" ||
                     transport->as_string() == "cuda_ipc");
  if (!real)
    v.errors.push_back("emulated transport: " +
                       (transport ? json::to_string(*transport, false) : "none"));
  if (!used || !used->is_integer() || used->as_int64() < processes) {
    v.errors.push_back("the case ran on " +
                       (used ? json::to_string(*used, false) : std::string("?")) +
                       " processes, the row needs " + std::to_string(processes));
  }
  v.evidence["transport"] = transport ? *transport : Value(nullptr);
  v.evidence["processes_used"] = used ? *used : Value(nullptr);
}

void evaluate_case(const AcceptanceRow& row, const Value& c, const Thresholds& t, RowVerdict& v,
                   const std::string& label) {
  check_metric(c, "drift.cp_merge_fp32.out.max_abs", t.out_max_abs, v, label);
  check_metric(c, "drift.cp_merge_fp32.lse.max_abs", t.lse_max_abs, v, label);
  check_metric(c, "merge_order_probe.out.max_abs", 0.0, v, label);
  check_metric(c, "merge_order_probe.lse.max_abs", 0.0, v, label);
  if (row.backward_and_dlogp) {
    for (const char* g : {"dq", "dk", "dv"}) {
      check_metric(c, std::string("backward.report.drifts.0.") + g + ".max_abs", t.gradient_max_abs,
                   v, label);
    }
    check_metric(c, "dlogp.drift.max_abs", t.dlogp_max_abs, v, label);
  }
  if (row.bitwise_topology) {
    const Value* eq = at_path(c, "drift.topology_invariance.bitwise_equal");
    const Value* req = at_path(c, "drift.topology_invariance.required");
    if (!eq || !req || !eq->is_bool() || !req->is_bool() || !req->as_bool() || !eq->as_bool()) {
      v.errors.push_back(label + "topology invariance is not a required, bitwise-equal check");
    }
  }
  check_split_plans(c, v);
  check_plan_set(c, v);
  check_transport(c, row.processes, v);
}

// The case named `name` in the report's list `list` ("cases" or "paged_cases").
const Value* find_case(const Value& report, const char* list, const std::string& name) {
  const Value* cases = at_path(report, list);
  if (cases == nullptr || !cases->is_array()) return nullptr;
  for (const Value& c : cases->as_array()) {
    const Value* n = at_path(c, "case_name");
    if (n != nullptr && n->is_string() && n->as_string() == name) return &c;
  }
  return nullptr;
}

// One invariance of a paged case: applicable, required, passed, and exactly 0 drift.
void check_paged_invariance(const Value& c, const std::string& name, RowVerdict& v,
                            const std::string& label) {
  const std::string base = "paged.invariance." + name;
  const Value* inv = at_path(c, base);
  if (inv == nullptr) {
    v.errors.push_back(label + "missing invariance " + name);
    return;
  }
  for (const char* flag : {"applicable", "required", "passed"}) {
    const Value* f = at_path(*inv, flag);
    if (f == nullptr || !f->is_bool() || !f->as_bool())
      v.errors.push_back(label + name + "." + flag + " is not true");
  }
  check_metric(c, base + ".out.max_abs", 0.0, v, label);
  check_metric(c, base + ".lse.max_abs", 0.0, v, label);
}

void evaluate_paged_case(const Value& c, const Thresholds& t, RowVerdict& v) {
  check_metric(c, "paged.drift.candidate.out.max_abs", t.paged_out_max_abs, v, "");
  check_metric(c, "paged.drift.candidate.lse.max_abs", t.paged_lse_max_abs, v, "");
  check_metric(c, "paged.drift.dlogp.max_abs", t.paged_dlogp_max_abs, v, "");
  const Value* invariances = at_path(c, "paged.invariance");
  if (invariances == nullptr || !invariances->is_object() || invariances->size() == 0) {
    v.errors.push_back("no invariances");
  } else {
    for (const auto& [name, inv] : invariances->as_object()) check_paged_invariance(c, name, v, "");
  }
  const Value* batch = at_path(c, "paged.shape.batch");
  if (batch == nullptr || !batch->is_integer() || batch->as_int64() < 2) {
    v.errors.push_back("fewer than 2 sequences: batch composition is no evidence");
  }
  const Value* complete = at_path(c, "paged.split_kv.coverage_complete");
  if (complete == nullptr || !complete->is_bool() || !complete->as_bool()) {
    v.errors.push_back("split plans do not cover every sequence's KV");
  }
  const Value* policy = at_path(c, "paged.split_kv.requested.policy");
  const Value* size = at_path(c, "paged.split_kv.requested.split_size");
  const Value* plans = at_path(c, "paged.split_kv.plans");
  if (policy == nullptr || size == nullptr || plans == nullptr || !plans->is_array() ||
      plans->size() == 0) {
    v.errors.push_back("missing split plans");
    return;
  }
  bool split_somewhere = false;
  for (const Value& p : plans->as_array()) {
    const Value* actual = at_path(p, "actual_policy");
    const Value* actual_size = at_path(p, "actual_split_size");
    const Value* blocks = at_path(p, "blocks");
    if (actual == nullptr || *actual != *policy || actual_size == nullptr ||
        *actual_size != *size || blocks == nullptr || !blocks->is_array()) {
      v.errors.push_back("split plan requested (" + json::to_string(*policy, false) + ", " +
                         json::to_string(*size, false) + ") but not run as requested");
      return;
    }
    split_somewhere = split_somewhere || blocks->size() > 1;
  }
  // A fixed split no sequence is long enough to cut computes what `disabled` does: no evidence.
  if (policy->is_string() && policy->as_string() == "fixed" && !split_somewhere) {
    v.errors.push_back("the fixed split never cut a sequence (every plan is one block)");
  }
}

// The pair (trainer, rollout) of the report's trainer_vs_rollout block: aligned, and bitwise
// equal in out, lse and logprob.
void evaluate_pair(const Value& report, const std::string& trainer, const std::string& rollout,
                   RowVerdict& v) {
  const Value* pairs = at_path(report, "trainer_vs_rollout.pairs");
  const Value* pair = nullptr;
  if (pairs != nullptr && pairs->is_array()) {
    for (const Value& p : pairs->as_array()) {
      const Value* t = at_path(p, "trainer");
      const Value* r = at_path(p, "rollout");
      const Value* merge = at_path(p, "trainer_merge");
      const bool canonical =
          merge == nullptr || (merge->is_string() && merge->as_string() == "canonical");
      if (t && r && t->is_string() && r->is_string() && t->as_string() == trainer &&
          r->as_string() == rollout && canonical)
        pair = &p;
    }
  }
  if (pair == nullptr) {
    v.errors.push_back("the pair " + trainer + " vs " + rollout + " is not in the report");
    return;
  }
  for (const char* flag : {"aligned", "bitwise_equal", "passed"}) {
    const Value* f = at_path(*pair, flag);
    if (f == nullptr || !f->is_bool() || !f->as_bool())
      v.errors.push_back(std::string("trainer_vs_rollout pair: ") + flag + " is not true");
  }
  for (const char* what : {"out", "lse", "logprob"}) {
    const std::string path = std::string(what) + ".mismatch_count";
    const Value* n = at_path(*pair, path);
    if (n == nullptr || !n->is_integer() || n->as_int64() != 0) {
      v.errors.push_back("trainer_vs_rollout pair: " + path + " is not 0");
    }
    v.evidence["metrics"][path] = n ? *n : Value(nullptr);
  }
}

}  // namespace

RowVerdict evaluate_row(const AcceptanceRow& row, const Value& report, const Thresholds& t,
                        int world_size, const std::string& report_path) {
  RowVerdict v;
  v.name = row.name;
  v.required = row.required;
  v.evidence["report"] = report_path.empty() ? Value(nullptr) : Value(report_path);
  Value cases = Value::array();
  for (const std::string& c : row.cases) cases.push_back(c);
  v.evidence["cases"] = std::move(cases);
  v.evidence["metrics"] = Value::object();
  if (row.kind == AcceptanceRow::Kind::not_yet_available) {
    v.status = "unavailable";
    v.errors.push_back(row.unavailable_reason);
    return v;
  }
  if (world_size < row.processes) {
    v.status = "unavailable";
    v.errors.push_back("needs " + std::to_string(row.processes) +
                       " processes (one per logical rank); the job has " +
                       std::to_string(world_size));
    return v;
  }
  if (report.is_null()) {
    v.status = "not_run";
    v.errors.push_back("nothing was executed");
    return v;
  }
  if (row.kind == AcceptanceRow::Kind::rollout_pair) {
    evaluate_pair(report, row.cases.at(0), row.cases.at(1), v);
    v.status = v.errors.empty() ? "passed" : "failed";
    return v;
  }
  const bool paged = row.kind == AcceptanceRow::Kind::paged_case ||
                     row.kind == AcceptanceRow::Kind::paged_invariance;
  std::vector<const Value*> found;
  for (const std::string& name : row.cases) {
    const Value* c = find_case(report, paged ? "paged_cases" : "cases", name);
    if (c == nullptr) {
      v.status = "not_run";
      v.errors.push_back("case " + name + " is not in the report");
      return v;
    }
    found.push_back(c);
  }
  for (std::size_t i = 0; i < found.size(); ++i) {
    const std::string label = found.size() > 1 ? row.cases[i] + ": " : "";
    if (row.kind == AcceptanceRow::Kind::paged_case) {
      evaluate_paged_case(*found[i], t, v);
    } else if (row.kind == AcceptanceRow::Kind::paged_invariance) {
      check_paged_invariance(*found[i], row.invariance, v, label);
    } else {
      evaluate_case(row, *found[i], t, v, label);
    }
  }
  if (row.kind == AcceptanceRow::Kind::protocol_equivalence) {
    v.evidence["digests"] = Value::object();
    for (const char* d : {"drift.cp_merge_fp32.out.digest", "drift.cp_merge_fp32.lse.digest",
                          "drift.bf16_kernel.out.digest", "drift.dtype_path_vs_fp32.out.digest"}) {
      const Value* first = at_path(*found[0], d);
      bool same = first != nullptr && first->is_string();
      for (const Value* c : found) {
        const Value* x = at_path(*c, d);
        same = same && x != nullptr && *x == *first;
      }
      if (!same) v.errors.push_back(std::string("protocols disagree (or lack a digest) on ") + d);
      v.evidence["digests"][d] = first ? *first : Value(nullptr);
    }
  }
  v.status = v.errors.empty() ? "passed" : "failed";
  return v;
}

RowVerdict manifest_row(const AcceptanceRow& row) {
  RowVerdict v;
  v.name = row.name;
  v.required = row.required;
  Value cases = Value::array();
  for (const std::string& c : row.cases) cases.push_back(c);
  v.evidence["cases"] = std::move(cases);
  v.status = row.kind == AcceptanceRow::Kind::not_yet_available ? "unavailable" : "not_run";
  v.errors.push_back(row.kind == AcceptanceRow::Kind::not_yet_available
                         ? row.unavailable_reason
                         : "manifest mode executes nothing");
  return v;
}

Value acceptance_json(const std::string& mode, const std::vector<RowVerdict>& rows,
                      const Thresholds& t, const Value& runtime, const std::string& created_at) {
  Value v = Value::object();
  v["schema_version"] = kAcceptanceSchema;
  v["issue"] = 235;
  v["created_at_utc"] = created_at;
  v["mode"] = mode;
  v["runtime"] = runtime;
  v["thresholds"] = thresholds_json(t);
  Value matrix = Value::array(), cases = Value::array(), failed = Value::array();
  bool all = true;
  for (const RowVerdict& r : rows) {
    if (r.required) matrix.push_back(r.name);
    Value c = Value::object();
    c["name"] = r.name;
    c["required"] = r.required;
    c["status"] = r.status;
    c["passed"] = r.passed();
    Value errors = Value::array();
    for (const std::string& e : r.errors) errors.push_back(e);
    c["errors"] = std::move(errors);
    c["evidence"] = r.evidence;
    cases.push_back(std::move(c));
    if (r.required && !r.passed()) {
      failed.push_back(r.name);
      all = false;
    }
  }
  // Manifest mode executes nothing, so it can never pass.
  all = all && mode == "run";
  v["required_matrix"] = std::move(matrix);
  v["cases"] = std::move(cases);
  v["failed_required_cases"] = std::move(failed);
  v["passed"] = all;
  v["status"] = all ? "passed" : "failed";
  return v;
}

}  // namespace cpd
