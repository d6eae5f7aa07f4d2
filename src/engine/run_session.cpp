#include "engine/run_session.h"

#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "comm/agree.h"
#include "comm/fault_injection.h"
#include "comm/gpu_transports.h"
#include "core/errors.h"
#include "engine/case_runner.h"
#include "engine/rollout_pairs.h"
#include "kernels/attention_backend.h"

namespace cpd {
namespace {

// This process's GPU: one per process of the node, picked by the node-local rank.
int local_device(const CommContext& comm) {
  return comm.local_rank() % std::max(1, cuda_device_count());
}

// The compute backend `device` asks for (auto: CUDA when built and a device is present). All
// processes take the same kind: under auto, one that sees a device makes it CUDA for every
// process, and a process without one then fails them all with the same line.
std::unique_ptr<AttentionBackend> select_backend(Device device, ThreadPool& pool,
                                                 const CommContext& comm) {
  const bool want_cuda =
      comm.any(device == Device::cuda ||
               (device == Device::auto_select && cuda_backend_built() && cuda_device_count() > 0));
  if (!want_cuda) return make_cpu_backend(pool);
  std::unique_ptr<AttentionBackend> backend;
  agree_or_throw(comm, true, "", [&] { backend = make_cuda_backend(local_device(comm)); });
  return backend;
}

// The transport the request asks for (auto: mpi). The GPU transports need the CUDA backend
// and use its device.
std::unique_ptr<Transport> select_transport(const RunRequest& request,
                                            const AttentionBackend& backend,
                                            const CommContext& comm) {
  if (request.transport == TransportChoice::auto_select ||
      request.transport == TransportChoice::mpi) {
    return make_mpi_transport(comm);
  }
  const bool nccl = request.transport == TransportChoice::nccl;
  if (!cuda_backend_built() || (nccl && !nccl_transport_built())) {
    return nccl ? make_nccl_transport(comm, {})
                : make_cuda_ipc_transport(comm, {});  // "built without CUDA/NCCL"
  }
  if (std::string(backend.name()) != "cuda") {
    throw UsageError(std::string("--transport ") + to_string(request.transport) +
                     " moves GPU buffers: it needs the CUDA backend (--device cuda)");
  }
  GpuTransportOptions o;
  o.device = local_device(comm);  // the backend's
  o.timeout_seconds = request.comm_timeout_seconds;
  o.staging_bytes = static_cast<std::uint64_t>(request.staging_mib) << 20;
  return nccl ? make_nccl_transport(comm, o) : make_cuda_ipc_transport(comm, o);
}

// The transport the request asks for, wrapped in --inject-fault's fault when one is given.
std::unique_ptr<Transport> run_transport(const RunRequest& request, AttentionBackend& backend,
                                         const CommContext& comm, bool* fired) {
  std::unique_ptr<Transport> t = select_transport(request, backend, comm);
  if (!request.fault || !breaks_an_exchange(request.fault->kind)) return t;
  FaultSpec fault = *request.fault;
  if (fault.kind == FaultKind::slow_rank) {
    if (!request.comm_timeout_given) {
      throw UsageError("--inject-fault slow-rank needs --comm-timeout S: the wait it must outlast");
    }
    if (comm.size() == 1) {
      throw UsageError("--inject-fault slow-rank needs a second process to wait for it");
    }
    fault.slow_seconds = 3 * request.comm_timeout_seconds + 5;
  }
  if (request.fault->rank >= comm.size()) {
    throw UsageError("--inject-fault " + std::string(to_string(request.fault->kind)) + "@" +
                     std::to_string(request.fault->rank) + ": the job has " +
                     std::to_string(comm.size()) + " process" + (comm.size() == 1 ? "" : "es"));
  }
  return with_fault(std::move(t), fault, comm.rank(), fired);
}

}  // namespace

int default_threads(const CommContext& comm) {
  // The CPUs this process may run on: a launcher that binds it (srun --cpus-per-task, mpirun
  // --bind-to) has said how many are its own; an unbound process shares the node's cores with
  // the other processes on it.
  const int node = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  const int allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : node;
  if (allowed > 0 && allowed < node) return allowed;
  return std::max(1, node / std::max(1, comm.local_size()));
}

RunSession::RunSession(const RunRequest& request, const CommContext& comm)
    : comm_(comm),
      pool_(request.threads > 0 ? request.threads : default_threads(comm)),
      backend_(select_backend(request.device, pool_, comm)),
      fault_(request.fault),
      transport_(run_transport(request, *backend_, comm, &fault_fired_)),
      inputs_(request.problem, pool_, *backend_) {
  // The MPI transport's waits honour --comm-timeout only when it is given: on the CPU a peer
  // can legitimately compute for a long time (the GPU transports apply it always).
  if (request.comm_timeout_given) comm.set_wait_timeout(request.comm_timeout_seconds);
  context_.emplace(
      RunContext{inputs_.problem(), pool_, inputs_, *transport_, comm.collectives(), cp1_results_});
  if (request.include_backward) context_->cp1_backward = &cp1_backward_;
  if (request.include_lane_backward) {
    if (!backend_->has_lane_partials()) {
      throw UsageError(std::string("--include-lane-backward: the ") + backend_->name() +
                       " backend cannot run it (the CPU backend can: --device cpu)");
    }
    context_->te_p2p_backward = true;
  }
  if (request.include_dlogp) context_->vocab_size = request.vocab_size;
  context_->round_rows = request.round_rows;
  // On a GPU, the FP32 path runs on the CPU too: the report shows the two agree bit for bit.
  if (std::string(backend_->name()) != "cpu" && request.cpu_check) {
    cpu_backend_ = make_cpu_backend(pool_);
    cpu_inputs_ = std::make_unique<InputStore>(inputs_.problem(), pool_, *cpu_backend_);
    context_->cpu_rerun_inputs = cpu_inputs_.get();
  }
}

RunSession::~RunSession() = default;

void RunSession::run(const RunPlan& plan, CaseSink& sink, bool progress) {
  const RunContext& ctx = *context_;
  const bool say = progress && comm_.rank() == 0;
  if (ctx.problem.rope) run_rope_check(ctx, sink);
  std::optional<RunProgress> progress_of;
  RunContext with_progress = ctx;
  // With both sides in the run, each case leaves its rows at the rollout's decoded positions
  // on rank 0 for the trainer-vs-rollout pairs.
  std::optional<DecodedCapture> decoded;
  if (!plan.cases.empty() && !plan.paged.empty()) {
    decoded.emplace();
    decoded->workload =
        make_paged_workload(ctx.problem, plan.paged_options.page_size, plan.paged_options.q_len);
    decoded->vocab_size = plan.paged_options.vocab_size;
    with_progress.decoded = &*decoded;
  }
  // Each case's schedule, built where it runs (a plan of many large grids need not be held at
  // once); the progress line first sums them all.
  const ScheduleOptions options = schedule_options(ctx);
  const auto schedule_of = [&](const CaseSpec& spec) {
    return schedule_case(CaseGrid(ctx.problem, spec, ctx.round_rows), options);
  };
  if (say) {
    std::vector<double> work;
    for (const CaseSpec& spec : plan.cases) work.push_back(schedule_of(spec).flops());
    with_progress.progress = &progress_of.emplace(std::move(work), stderr);
  }
  for (std::size_t i = 0; i < plan.cases.size(); ++i) {
    if (say) progress_of->start_case(i, case_name(plan.cases[i], ctx.problem));
    if (i + 1 == plan.cases.size() && plan.paged.empty()) {
      // Nothing runs after this case: a memoised result could serve no one.
      cp1_results_.stop_memoising();
      cp1_backward_.stop_memoising();
    }
    run_schedule(with_progress, plan.cases[i], schedule_of(plan.cases[i]), sink);
  }
  if (plan.paged.empty()) {
    require_fault_fired();
    return;
  }
  if (say) std::fprintf(stderr, "cpdrift: %zu paged cases ...\n", plan.paged.size());
  PagedOptions paged = plan.paged_options;
  paged.progress = progress;
  run_paged_cases(with_progress, paged, plan.paged, sink);
  if (decoded) sink.rollout_pairs(*decoded);
  require_fault_fired();
}

void RunSession::require_fault_fired() {
  if (!fault_ || !breaks_an_exchange(fault_->kind)) return;  // the dump checks its own
  // A test aid that did nothing must not let the run pass as if it had.
  const bool missed = comm_.rank() == fault_->rank && !fault_fired_;
  const std::string error = transport_->agree(
      missed ? "--inject-fault: process " + std::to_string(fault_->rank) + " sent no partial " +
                   "state in exchange " + std::to_string(fault_->when) + ": nothing was injected"
             : "");
  if (!error.empty()) throw UsageError(error);
}

}  // namespace cpd
