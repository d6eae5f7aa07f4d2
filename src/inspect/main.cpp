// cpdrift-inspect: reads cpdrift's HDF5 dumps (docs/inspect.md). No MPI: run it directly.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "inspect/fault_guard.h"
#include "inspect/inspect_main.h"

int main(int argc, char** argv) {
  // A file past `ulimit -f` fails its write, which is reported, instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  cpd::inspect::install_fault_guard();
  const std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  return cpd::inspect::inspect_main(args, stdout, stderr);
}
