// Where the engine's run loop hands what each case computed: the layers above it (metrics,
// dump, report) implement this and measure, digest and record; the engine never sees a figure.
#pragma once

#include "engine/case_outputs.h"
#include "engine/paged/paged_case.h"
#include "engine/rollout_pairs.h"

namespace cpd {

class CaseSink {
 public:
  virtual ~CaseSink() = default;
  /// Each call is collective (every process gets the same calls in the same order); what it is
  /// given lives until it returns.
  virtual void rope(const RopeOutputs& outputs) = 0;
  /// A prefill case arrives as its parts, in the order they complete, then its record; each
  /// part's tensors are freed when the call returns.
  virtual void prefill_part(const CasePart& part) = 0;
  virtual void prefill_case(const CaseRecord& record) = 0;
  virtual void paged_case(const PagedCaseOutputs& outputs) = 0;
  /// After the paged cases, when the run has prefill cases too: both sides' rows at the
  /// rollout's decoded positions (on rank 0; empty elsewhere), for the trainer-vs-rollout pairs.
  virtual void rollout_pairs(const DecodedCapture& capture) = 0;
};

}  // namespace cpd
