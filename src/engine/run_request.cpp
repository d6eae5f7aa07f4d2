#include "engine/run_request.h"

#include <algorithm>

#include "core/errors.h"

namespace cpd {
namespace {

[[noreturn]] void bad(const std::string& what) { throw UsageError(what); }

// The prefill/chunked cases: tp → cp → split → layout → protocol.
std::vector<CaseSpec> expand_cases(const RunRequest& o) {
  std::vector<CaseSpec> cases;
  for (int tp : o.tp_sizes) {
    for (int cp : o.cp_sizes) {
      for (const auto& split : o.splits) {
        if (!o.runs(split ? RunMode::chunked_prefill : RunMode::prefill)) continue;
        for (CpLayout layout : o.layouts) {
          for (Protocol protocol : o.protocols) {
            CaseSpec spec{tp, cp, split, layout, protocol};
            const std::string name = case_name(spec, o.problem);
            if (const std::string why = validate_case(spec, o.problem); !why.empty()) {
              throw UsageError(name + ": " + why);
            }
            for (const CaseSpec& c : cases) {
              if (case_name(c, o.problem) == name) {
                throw UsageError(
                    name + " is listed twice (a repeated size, or none/full/no_split together)");
              }
            }
            cases.push_back(spec);
          }
        }
      }
    }
  }
  return cases;
}

// The paged cases: split policy → mode.
std::vector<PagedCaseSpec> expand_paged_cases(const RunRequest& o) {
  std::vector<PagedCaseSpec> cases;
  if (!o.runs(RunMode::paged_prefill) && !o.runs(RunMode::decode)) return cases;
  make_paged_workload(o.problem, o.page_size,
                      o.q_len);  // throws UsageError when it cannot be built
  const std::int64_t fixed = o.fixed_split_size.value_or(4 * std::int64_t{o.page_size});
  if (fixed % o.page_size != 0) {
    bad("--fixed-split-size " + std::to_string(fixed) + ": must be a multiple of --page-size " +
        std::to_string(o.page_size));
  }
  std::vector<SplitPolicy> policies;
  for (const SplitPolicy p : o.split_policies) {
    if (std::find(policies.begin(), policies.end(), p) != policies.end()) {
      bad(std::string("--split-kv-policies: ") + to_string(p) + " is listed twice");
    }
    policies.push_back(p);
  }
  // Rollout-TP-major, then plan-major, so each plan's lanes run once for both modes.
  for (const int tp : o.rollout_tp_sizes) {
    if (const std::string why = tp_problem(o.problem.dims, tp); !why.empty())
      bad("--rollout-tp-sizes " + std::to_string(tp) + ": " + why);
    for (const SplitPolicy p : policies) {
      for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode}) {
        if (!o.runs(m == PagedMode::decode ? RunMode::decode : RunMode::paged_prefill)) continue;
        cases.push_back(PagedCaseSpec{m, SplitKv{p, p == SplitPolicy::fixed ? fixed : 0}, tp});
      }
    }
  }
  return cases;
}

}  // namespace

const char* to_string(Device d) { return name_of(kDeviceNames, d); }
const char* to_string(TransportChoice t) { return name_of(kTransportNames, t); }
const char* to_string(RunMode m) { return name_of(kRunModeNames, m); }

RunPlan plan_run(const RunRequest& request) {
  RunPlan plan;
  plan.cases = expand_cases(request);
  plan.paged = expand_paged_cases(request);
  if (plan.cases.empty() && plan.paged.empty()) bad("--modes: nothing to run");
  plan.paged_options = PagedOptions{request.page_size, request.q_len, request.vocab_size, false};
  return plan;
}

}  // namespace cpd
