// The run's report, assembled in one place: its header read off the session that runs it, each
// case as it completes — the digest of every published tensor and, when dumping, the tensor
// itself (rank 0 writes it a piece at a time), then the case's statistics — and, once every case
// ran, the verdict, each process's peak memory and the wall time.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "engine/case_sink.h"
#include "engine/run_session.h"
#include "io/tensor_dump.h"
#include "metrics/digest.h"
#include "report/run_report.h"

namespace cpd {

class RunRecorder final : public CaseSink {
 public:
  /// A run's recorder: starts `report` with the problem, the gates, and where and how the run
  /// happens (`session`'s threads, backend and transport; the launch and build of `comm`), then
  /// appends each case. `dumping`: a dump is being written, so every process streams the dumped
  /// tensors; `dump`: the writer on rank 0, null elsewhere.
  RunRecorder(RunReport& report, RunSession& session, const CommContext& comm,
              const Thresholds& thresholds, const std::string& command_line, bool dumping,
              TensorDump* dump);
  /// Only appends the cases to `report` (tests, the bench): no header, no finish.
  RunRecorder(RunReport& report, const Collectives& collectives, ThreadPool& pool, bool dumping,
              TensorDump* dump);

  /// Once every case ran: the failed checks (rank 0's verdict, as it holds the digests, given to
  /// every process), each process's peak resident memory, and the wall time since `started`.
  /// Collective; needs the run's constructor.
  void finish(std::chrono::steady_clock::time_point started);

  /// Called on every process after each prefill case is recorded (rank 0 prints its row).
  std::function<void(const CaseResult&)> on_case;

  void rope(const RopeOutputs& outputs) override;
  void prefill_part(const CasePart& part) override;
  void prefill_case(const CaseRecord& record) override;
  void paged_case(const PagedCaseOutputs& outputs) override;
  void rollout_pairs(const DecodedCapture& capture) override;

 private:
  // Digests of `tensors` at rank 0 ("" elsewhere and where none is taken); dumped ones written.
  std::vector<std::string> publish(const std::vector<CaseTensor>& tensors);
  void annotate(const std::string& group, const DumpAttributes& attributes);

  RunReport& report_;
  const CommContext* comm_ = nullptr;  // the run's; null for a recorder of cases only
  const Collectives& collectives_;
  ThreadPool& pool_;
  bool dumping_;
  TensorDump* dump_;
  CaseResult pending_;  // the prefill case whose parts are arriving
};

}  // namespace cpd
