#include "engine/case_schedule.h"

#include "engine/case_run.h"
#include "engine/memory_plan.h"

namespace cpd {

double CaseSchedule::flops() const {
  double f = 0;
  for (const Phase& p : phases) f += p.flops();
  return f;
}

Traffic CaseSchedule::traffic() const {
  Traffic t;
  for (const Phase& p : phases) t += p.work.total_sent();
  return t;
}

const Phase* CaseSchedule::find(PhaseKind kind) const {
  for (const Phase& p : phases) {
    if (p.kind == kind) return &p;
  }
  return nullptr;
}

ScheduleOptions schedule_options(const RunRequest& request, bool gpu) {
  return ScheduleOptions{forward_paths(request.problem.dtype, gpu, gpu && request.cpu_check),
                         request.include_backward, request.include_lane_backward,
                         request.include_dlogp ? request.vocab_size : 0};
}

CaseSchedule schedule_case(const CaseGrid& grid, const ScheduleOptions& o) {
  using K = PhaseKind;
  using R = KernelRate;
  const double forward = 4.0 * grid.problem.dims.head_dim;
  const double backward = 10.0 * grid.problem.dims.head_dim;
  CaseSchedule s{grid, {}};
  s.phases.push_back(Phase{kReferenceForwardPhase, K::reference_forward,
                           reference_forward_work(grid), forward, R::fp32, true,
                           phase_memory::reference_forward, phase_run::reference_forward});
  const PhaseWork pass = forward_work(grid);
  for (const ForwardPath& path : o.paths) {
    s.phases.push_back(Phase{kForwardPhasePrefix + std::string(path.name), K::forward, pass,
                             forward, path.bf16_rate ? R::bf16 : R::fp32, path.host,
                             [path](CaseMemory& m) { phase_memory::forward_path(m, path); },
                             [path](CaseRun& r) { phase_run::forward_path(r, path); }});
  }
  if (grid.problem.layer) {
    s.phases.push_back(Phase{kOProjPhase, K::o_proj, o_proj_work(grid),
                             2.0 * grid.problem.dims.head_dim, R::fp32, false, phase_memory::o_proj,
                             phase_run::o_proj});
  }
  if (o.vocab > 0) {
    s.phases.push_back(Phase{kDlogpPhase, K::dlogp, dlogp_work(grid, o.vocab), 0, R::fp32, false,
                             [v = o.vocab](CaseMemory& m) { phase_memory::dlogp(m, v); },
                             phase_run::dlogp});
  }
  if (o.backward) {
    s.phases.push_back(Phase{kReferenceBackwardPhase, K::reference_backward,
                             reference_backward_work(grid), backward, R::fp32_backward, true,
                             phase_memory::reference_backward, phase_run::reference_backward});
    s.phases.push_back(
        Phase{kBackwardPhase, K::backward, backward_work(grid), backward, R::fp32_backward, false,
              [lane = o.lane_backward](CaseMemory& m) { phase_memory::backward(m, lane); },
              phase_run::backward});
    if (grid.problem.layer) {
      s.phases.push_back(Phase{kLayerBackwardPhase, K::layer_backward, layer_backward_work(grid),
                               2.0 * grid.problem.dims.head_dim, R::fp32, false,
                               phase_memory::layer_backward, phase_run::layer_backward});
    }
  }
  return s;
}

}  // namespace cpd
