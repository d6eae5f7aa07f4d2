// doctest under mpirun: every process runs every test case, rank 0 prints, and all processes
// agree on the verdict (any failure anywhere fails the job everywhere). A process that
// failed prints its own report too, so nothing is hidden.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <memory>
#include <sstream>

#include "mpi_support.h"

#if defined(CPD_SKIP_WITHOUT_GPU)
#include "kernels/attention_backend.h"
#endif

namespace {
std::unique_ptr<cpd::CommContext> g_comm;
}

const cpd::CommContext& cpd::testing::comm() { return *g_comm; }

int main(int argc, char** argv) {
  g_comm = std::make_unique<cpd::CommContext>(&argc, &argv);
#if defined(CPD_SKIP_WITHOUT_GPU)
  // GPU tests: skipped as a whole (77, on every process alike) unless every process sees a
  // device, or, with CPD_SKIP_WITHOUT_OWN_GPU, a device of its own. Never a silent partial run.
  const int devices = cpd::cuda_device_count();
  const char* missing = nullptr;
  if (g_comm->any(devices == 0)) {
    missing = "a process sees no CUDA device";
#if defined(CPD_SKIP_WITHOUT_OWN_GPU)
  } else if (g_comm->any(devices < g_comm->local_size())) {
    missing = "processes share a GPU (NCCL needs one per process)";
#endif
  }
  if (missing != nullptr) {
    if (g_comm->rank() == 0)
      std::printf("[mpi] %s: these GPU tests are skipped (exit 77)\n", missing);
    g_comm.reset();
    return 77;
  }
#endif
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  std::ostringstream captured;
  if (g_comm->rank() != 0) context.setCout(&captured);
  const int failed = context.run();
  if (failed != 0 && g_comm->rank() != 0) {
    std::fprintf(stderr, "---- rank %d ----\n%s", g_comm->rank(), captured.str().c_str());
  }
  const bool any_failed = g_comm->any(failed != 0);
  if (g_comm->rank() == 0) {
    std::printf("[mpi] %d processes: %s\n", g_comm->size(), any_failed ? "FAILED" : "all passed");
  }
  g_comm.reset();
  return any_failed ? 1 : 0;
}
