// Test support for the MPI tests: everything a RunContext points at, over MPI (every process)
// or in this process alone.
#pragma once

#include <memory>

#include "engine/case_runner.h"
#include "kernels/input_store.h"
#include "mpi_support.h"

namespace cpd::testing {

// Everything a RunContext points at, over MPI (every process) or in this process alone, with
// the backward and dlogp legs on.
struct RunEnv {
  RunEnv(const Problem& p, bool over_mpi)
      : problem(p),
        inputs(problem, pool),
        transport(over_mpi ? make_mpi_transport(comm())
                           : std::unique_ptr<Transport>(std::make_unique<InProcessTransport>())),
        ctx{problem, pool, inputs, *transport, over_mpi ? comm().collectives() : one, cp1} {
    ctx.cp1_backward = &cp1_backward;
    ctx.vocab_size = 17;
  }
  Problem problem;
  ThreadPool pool{1};
  InputStore inputs;
  LocalCp1Results cp1;
  LocalCp1Backward cp1_backward;
  LocalCollectives one;
  std::unique_ptr<Transport> transport;
  RunContext ctx;
};

}  // namespace cpd::testing
