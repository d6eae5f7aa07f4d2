// evaluate_row: a row of the acceptance matrix judged from the executed report only.
#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include "accept/acceptance.h"

namespace cpd {

using json::Value;

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

// Whether the value is there and is `want` (true, false, a string, a number).
bool is(const Value* v, const Value& want) { return v != nullptr && *v == want; }

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

// The requested split (policy and size) and its plans, a non-empty array; records the error
// where any is missing.
bool has_split_plans(const Value* policy, const Value* size, const Value* plans, RowVerdict& v) {
  if (policy != nullptr && size != nullptr && plans != nullptr && plans->is_array() &&
      plans->size() > 0) {
    return true;
  }
  v.errors.push_back("missing split plans");
  return false;
}

std::string not_as_requested(const Value& policy, const Value& size) {
  return "split plan requested (" + json::to_string(policy, false) + ", " +
         json::to_string(size, false) + ") but not run as requested";
}

// Every executed plan (per owner, and per entry of the plan set: every TP rank's) ran as
// requested, with no fallback.
void check_split_plans(const Value& c, RowVerdict& v) {
  const Value* requested = at_path(c, "provenance.requested_split_kv_policy");
  const Value* size = at_path(c, "provenance.requested_split_kv_size");
  const Value* plans = at_path(c, "provenance.actual_split_kv_plans");
  if (!has_split_plans(requested, size, plans, v)) return;
  std::vector<const Value*> all;
  for (const Value& p : plans->as_array()) all.push_back(&p);
  if (const Value* e = at_path(c, "provenance.actual_split_kv_plan_set.entries");
      e != nullptr && e->is_array()) {  // its absence is check_plan_set's to report
    for (const Value& p : e->as_array()) all.push_back(&p);
  }
  for (const Value* p : all) {
    if (!is(at_path(*p, "actual_split_kv_policy"), *requested) ||
        !is(at_path(*p, "actual_split_kv_size"), *size) ||
        !is(at_path(*p, "split_kv_fallback"), false)) {
      v.errors.push_back(not_as_requested(*requested, *size));
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
      !tp->is_integer() || !cp->is_integer() || !entries->is_array() || !totals->is_array())
    return fail("fields missing");
  if (!is(coverage, "complete_batch_tp_cp_owner_cartesian_product"))
    return fail("coverage is not the complete cartesian product");
  const std::int64_t want = b->as_int64() * tp->as_int64() * cp->as_int64() * cp->as_int64();
  if (static_cast<std::int64_t>(entries->size()) != want)
    return fail(std::to_string(entries->size()) + " entries, B·TP·CP·CP = " + std::to_string(want));
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
  if (static_cast<std::int64_t>(tiles.size()) != b->as_int64() * tp->as_int64() * cp->as_int64())
    return fail("some (batch, tp, cp) has no entries");
}

void check_transport(const Value& c, int processes, RowVerdict& v) {
  if (!is(at_path(c, "distributed_p2p_reference.status"), "available")) {
    v.errors.push_back(
        "emulated transport: no real distributed run (distributed_p2p_reference not available)");
    return;
  }
  const Value* transport = at_path(c, "distributed_p2p_reference.transport");
  const Value* used = at_path(c, "distributed_p2p_reference.processes_used");
  if (!is(transport, "mpi") && !is(transport, "nccl") && !is(transport, "cuda_ipc"))
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
  if (row.bitwise_topology && (!is(at_path(c, "drift.topology_invariance.bitwise_equal"), true) ||
                               !is(at_path(c, "drift.topology_invariance.required"), true))) {
    v.errors.push_back(label + "topology invariance is not a required, bitwise-equal check");
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
    if (is(at_path(c, "case_name"), name)) return &c;
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
    if (!is(at_path(*inv, flag), true))
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
  if (!is(at_path(c, "paged.split_kv.coverage_complete"), true)) {
    v.errors.push_back("split plans do not cover every sequence's KV");
  }
  const Value* policy = at_path(c, "paged.split_kv.requested.policy");
  const Value* size = at_path(c, "paged.split_kv.requested.split_size");
  const Value* plans = at_path(c, "paged.split_kv.plans");
  if (!has_split_plans(policy, size, plans, v)) return;
  bool split_somewhere = false;
  for (const Value& p : plans->as_array()) {
    const Value* blocks = at_path(p, "blocks");
    if (!is(at_path(p, "actual_policy"), *policy) || !is(at_path(p, "actual_split_size"), *size) ||
        blocks == nullptr || !blocks->is_array()) {
      v.errors.push_back(not_as_requested(*policy, *size));
      return;
    }
    split_somewhere = split_somewhere || blocks->size() > 1;
  }
  // A fixed split no sequence is long enough to cut computes what `disabled` does: no evidence.
  if (is(policy, "fixed") && !split_somewhere) {
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
      const Value* merge = at_path(p, "trainer_merge");
      if (is(at_path(p, "trainer"), trainer) && is(at_path(p, "rollout"), rollout) &&
          (merge == nullptr || is(merge, "canonical")))
        pair = &p;
    }
  }
  if (pair == nullptr) {
    v.errors.push_back("the pair " + trainer + " vs " + rollout + " is not in the report");
    return;
  }
  for (const char* flag : {"aligned", "bitwise_equal", "passed"}) {
    if (!is(at_path(*pair, flag), true))
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
  RowVerdict v = row_verdict(row);
  v.evidence["report"] = report_path.empty() ? Value(nullptr) : Value(report_path);
  v.evidence["metrics"] = Value::object();
  const auto concluded = [&](const char* status, const std::string& why) {
    v.status = status;
    v.errors.push_back(why);
    return v;
  };
  if (row.kind == AcceptanceRow::Kind::not_yet_available)
    return concluded("unavailable", row.unavailable_reason);
  if (world_size < row.processes) {
    return concluded("unavailable", "needs " + std::to_string(row.processes) +
                                        " processes (one per logical rank); the job has " +
                                        std::to_string(world_size));
  }
  if (report.is_null()) return concluded("not_run", "nothing was executed");
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
    if (c == nullptr) return concluded("not_run", "case " + name + " is not in the report");
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

}  // namespace cpd
