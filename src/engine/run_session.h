// A run on this process: the workers, the compute backend and the transport the request asks
// for, the input memo and the CP=1 caches, set up once and shared by every case; and the run
// loop that hands each case's outputs to a sink.
#pragma once

#include <memory>
#include <optional>

#include "comm/comm_context.h"
#include "engine/case_sink.h"
#include "engine/run_context.h"
#include "engine/run_request.h"

namespace cpd {

/// Threads per process when not given: the CPUs the launcher bound this process to, else the
/// node's cores shared among its processes.
int default_threads(const CommContext& comm);

class RunSession {
 public:
  /// Collective: a process that cannot have the backend or transport asked for fails every
  /// process with the same UsageError, before any work.
  RunSession(const RunRequest& request, const CommContext& comm);
  RunSession(const RunSession&) = delete;
  RunSession& operator=(const RunSession&) = delete;
  ~RunSession();

  const RunContext& context() const { return *context_; }
  ThreadPool& pool() { return pool_; }
  int threads() const { return pool_.size(); }
  const AttentionBackend& backend() const { return *backend_; }
  const Transport& transport() const { return *transport_; }

  /// Runs the plan's cases in order and hands each to `sink`: the RoPE check (when the problem
  /// has RoPE), the prefill/chunked cases, then the paged cases. `progress`: rank 0 says on
  /// stderr when each case starts and each of its phases ends, with the share of the run's
  /// planned work done and the time left at that pace. Collective.
  void run(const RunPlan& plan, CaseSink& sink, bool progress);

 private:
  /// With --inject-fault: fails every process alike when the fault never fired.
  void require_fault_fired();

  const CommContext& comm_;
  ThreadPool pool_;
  std::unique_ptr<AttentionBackend> backend_;
  std::optional<FaultSpec> fault_;  // --inject-fault
  bool fault_fired_ = false;        // on the fault's process, once it has been injected
  std::unique_ptr<Transport> transport_;
  InputStore inputs_;
  LocalCp1Results cp1_results_;
  LocalCp1Backward cp1_backward_;
  std::unique_ptr<AttentionBackend> cpu_backend_;  // GPU runs: the FP32 path again on the CPU
  std::unique_ptr<InputStore> cpu_inputs_;
  std::optional<RunContext> context_;
};

}  // namespace cpd
