// Turns what the engine computes into the run's report as each case completes: the digest of
// every published tensor and, when dumping, the tensor itself (rank 0 writes it a piece at a
// time), then the case's statistics.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/case_sink.h"
#include "io/tensor_dump.h"
#include "metrics/digest.h"
#include "report/run_report.h"

namespace cpd {

class RunRecorder final : public CaseSink {
 public:
  /// Appends to `report`. `dumping`: a dump is being written, so every process streams the
  /// dumped tensors; `dump`: the writer on rank 0, null elsewhere.
  RunRecorder(RunReport& report, const Collectives& collectives, ThreadPool& pool, bool dumping,
              TensorDump* dump);

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
  const Collectives& collectives_;
  ThreadPool& pool_;
  bool dumping_;
  TensorDump* dump_;
  CaseResult pending_;  // the prefill case whose parts are arriving
};

}  // namespace cpd
