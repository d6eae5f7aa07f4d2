// The command line, parsed, agreed on and dispatched; every way a command can fail ends here
// as one line and an exit status (docs/reliability.md).
#include <cstdio>
#include <exception>
#include <new>

#include "cli/commands.h"
#include "cli/options.h"
#include "comm/agree.h"
#include "core/errors.h"
#include "inputs/input_files.h"
#include "inputs/layer_checkpoint.h"
#include "report/provenance.h"

namespace cpd {

int cli_main(const std::vector<std::string>& argv, const CommContext& comm) {
  const std::vector<std::string> args(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
  const bool root = comm.rank() == 0;
  // A failure on this process alone: it says so (`who` names it, or the message does) and takes
  // the whole job down with it. Nothing allocates on the way: it may be out of memory.
  char rank[32];
  std::snprintf(rank, sizeof rank, "rank %d: ", comm.rank());
  const auto failed_alone = [&](const char* who, const char* what) {
    std::fprintf(stderr, "cpdrift: error: %s%s\n", who, what);
    if (comm.size() > 1) comm.abort(kExitRuntime);
    return kExitRuntime;
  };
  try {
    // Every process must reach the same verdict on the same arguments, or none can proceed.
    CommandLine cl;
    agree_or_throw(comm, true, "", [&] { cl = parse_command_line(args); });
    if (!comm.same_everywhere(shell_join(args)))
      throw UsageError("the processes of this job were started with different arguments");
    // --inputs: every process opens the file (and checks it alike); rank 0 also hashes it for
    // the report. The run takes the file's B and S, and the checks that need them run.
    const bool running = cl.command == CommandLine::Command::run;
    RunOptions& run = running ? cl.run : cl.plan.run;
    if ((running || cl.command == CommandLine::Command::plan) && !run.inputs.empty()) {
      agree_or_throw(comm, true, "", [&] {
        use_input_file(run, open_input_file(run.inputs, run.request.problem.dims,
                                            run.request.problem.layer, root && running));
      });
    }
    // --weights: every process opens the checkpoint and checks the layer's tensors alike; each
    // reads the bytes of its own heads as its ranks use them.
    if ((running || cl.command == CommandLine::Command::plan) && !run.weights.empty()) {
      agree_or_throw(comm, true, "", [&] {
        Problem& p = run.request.problem;
        p.weights = std::make_shared<const LayerWeights>(
            p.dims, open_layer_checkpoint(run.weights, run.layer, p.dims));
      });
    }
    switch (cl.command) {
      case CommandLine::Command::help:
        if (root) std::fputs(usage_text().c_str(), stdout);
        return kExitOk;
      case CommandLine::Command::bench:
        return bench_command(cl.bench, comm);
      case CommandLine::Command::run:
        return execute_run(cl.run, comm, shell_join(argv)).passed() ? kExitOk : kExitChecksFailed;
      case CommandLine::Command::accept:
        return accept_command(cl.accept, comm, shell_join(argv));
      case CommandLine::Command::plan:
        return plan_command(cl.plan, comm);
      case CommandLine::Command::compare:
        return compare_command(cl.compare, comm, shell_join(argv));
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
    return failed_alone(rank,
                        "out of memory: this problem does not fit the process's memory; spread it "
                        "over more processes (mpirun -np N), or lower --seq-len, --batch or the "
                        "case list");
  } catch (const LibraryError& e) {
    return failed_alone("", e.what());  // it names the host, rank and call already
  } catch (const std::exception& e) {
    return failed_alone(rank, e.what());
  }
  return kExitOk;
}

}  // namespace cpd
