// Everything a RunContext points at, for cases run in this process alone (every logical rank
// here, the in-process transport): the bench's whole case and the engine-level tests.
#pragma once

#include "engine/run_context.h"

namespace cpd {

struct LocalRun {
  /// With the backward and dlogp legs when asked (`vocab` > 0).
  LocalRun(const Problem& p, ThreadPool& pool, bool backward, int vocab)
      : inputs(p, pool), ctx{p, pool, inputs, transport, one, cp1} {
    if (backward) ctx.cp1_backward = &cp1_backward;
    ctx.vocab_size = vocab;
  }
  LocalRun(const LocalRun&) = delete;
  LocalRun& operator=(const LocalRun&) = delete;

  InputStore inputs;
  InProcessTransport transport;
  LocalCollectives one;
  LocalCp1Results cp1;
  LocalCp1Backward cp1_backward;
  RunContext ctx;
};

}  // namespace cpd
