// Where the engine's run loop hands what each case computed: the layers above it (metrics,
// dump, report) implement this and measure, digest and record; the engine never sees a figure.
#pragma once

#include "cpdrift/engine/case_outputs.h"
#include "cpdrift/paged/paged_case.h"

namespace cpd {

class CaseSink {
 public:
  virtual ~CaseSink() = default;
  /// Each call is collective (every process gets the same calls in the same order); the
  /// outputs live until it returns.
  virtual void rope(const RopeOutputs& outputs) = 0;
  virtual void prefill_case(const CaseOutputs& outputs) = 0;
  virtual void paged_case(const PagedCaseOutputs& outputs) = 0;
};

}  // namespace cpd
