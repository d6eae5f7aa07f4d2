// cpdrift: measures how far CP attention drifts from a single-rank FP32 reference, and
// proves it zero where the global block grid allows. See README.md and docs/.
#include <malloc.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "comm/comm_context.h"
#include "core/errors.h"
#include "core/util/temp_file_guard.h"

int main(int argc, char** argv) {
  using namespace cpd;
  // Shards and partial states are large, short-lived buffers. glibc would hand each back to
  // the kernel and take fresh zeroed pages next time; keeping them in the heap makes reuse free.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // A file past `ulimit -f` fails its write with EFBIG and the writer says so, with the path,
  // instead of the process dying of SIGXFSZ with nothing said.
  std::signal(SIGXFSZ, SIG_IGN);
  const std::vector<std::string> args(argv, argv + argc);  // before MPI sees them
  std::unique_ptr<CommContext> comm;
  try {
    comm = std::make_unique<CommContext>(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpdrift: error: cannot start MPI: %s\n", e.what());
    return kExitRuntime;
  }
  handle_interrupts(comm->rank() == 0);
  const int status = cli_main(args, *comm);
  // Every output is written and every line printed. Open MPI ends a job's other processes as
  // soon as one exits non-zero (a failed drift check is status 1 on every process), so rank 0
  // may be sent SIGTERM while it finalizes MPI: the job is over, and a line would be noise
  // after the verdict.
  handle_interrupts(false);
  return status;  // comm's destructor finalizes MPI
}
