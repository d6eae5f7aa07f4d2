// cpdrift: measures how far CP attention drifts from a single-rank FP32 reference, and
// proves it zero where the global block grid allows. See README.md and docs/.
#include <malloc.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cpdrift/cli/commands.h"
#include "cpdrift/cli/options.h"
#include "cpdrift/comm/comm_context.h"
#include "cpdrift/core/errors.h"
#include "cpdrift/report/provenance.h"
#include "cpdrift/util/temp_file_guard.h"

int main(int argc, char** argv) {
  using namespace cpd;
  // Shards and partial states are large, short-lived buffers. glibc would hand each back to
  // the kernel and take fresh zeroed pages next time (10% of a run went to page clearing);
  // keeping them in the heap makes reuse free.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // A file past `ulimit -f` fails its write with EFBIG and the writer says so, with the path,
  // instead of the process dying of SIGXFSZ with nothing said.
  std::signal(SIGXFSZ, SIG_IGN);
  const std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<std::string> all(argv, argv + argc);
  std::unique_ptr<CommContext> comm;
  try {
    comm = std::make_unique<CommContext>(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpdrift: error: cannot start MPI: %s\n", e.what());
    return kExitRuntime;
  }
  const bool root = comm->rank() == 0;
  handle_interrupts(root);
  try {
    // Every process must reach the same verdict on the same arguments, or none can proceed.
    CommandLine cl;
    std::string error;
    try {
      cl = parse_command_line(args);
    } catch (const UsageError& e) {
      error = e.what();
    }
    error = comm->agree(error);
    if (error.empty() && !comm->same_everywhere(shell_join(args))) {
      error = "the processes of this job were started with different arguments";
    }
    if (!error.empty()) throw UsageError(error);
    switch (cl.command) {
      case CommandLine::Command::help:
        if (root) std::fputs(usage_text().c_str(), stdout);
        return kExitOk;
      case CommandLine::Command::bench:
        return bench_command(cl.bench, *comm);
      case CommandLine::Command::run:
        return run_command(cl.run, *comm, shell_join(all));
      case CommandLine::Command::accept:
        return accept_command(cl.accept, *comm, shell_join(all));
      case CommandLine::Command::plan:
        return plan_command(cl.plan, *comm);
    }
  } catch (const UsageError& e) {
    // Agreed on every process: one line from rank 0, the same status everywhere, no hang.
    if (root) std::fprintf(stderr, "cpdrift: error: %s\n", e.what());
    return kExitUsage;
  } catch (const ProtocolError& e) {
    // Protocol violations are agreed across processes before they are thrown.
    if (root) std::fprintf(stderr, "cpdrift: error: %s\n", e.what());
    return kExitRuntime;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "cpdrift: error: rank %d: out of memory: this problem does not fit the process's "
                 "memory; spread it over more processes (mpirun -np N), or lower --seq-len, "
                 "--batch or the case list\n",
                 comm->rank());
    if (comm->size() > 1) comm->abort(kExitRuntime);
    return kExitRuntime;
  } catch (const LibraryError& e) {
    // A library call failed here: the message names the host, rank and call already.
    std::fprintf(stderr, "cpdrift: error: %s\n", e.what());
    if (comm->size() > 1) comm->abort(kExitRuntime);
    return kExitRuntime;
  } catch (const std::exception& e) {
    // A failure on this process alone: say so and take the whole job down with it.
    std::fprintf(stderr, "cpdrift: error: rank %d: %s\n", comm->rank(), e.what());
    if (comm->size() > 1) comm->abort(kExitRuntime);
    return kExitRuntime;
  }
  return kExitOk;
}
