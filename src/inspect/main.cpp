// cpdrift-inspect: reads cpdrift's HDF5 dumps (docs/inspect.md). No MPI: run it directly.
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "inspect/command_line.h"
#include "inspect/dump_reader.h"

namespace {

// The last line of defence of "one line and status 2, never a crash": HDF5 1.10 does not
// checksum its metadata, and some corrupted object headers make the library itself fault (a
// SIGSEGV freeing a half-decoded attribute; found by fuzzing, docs/inspect.md). Async-signal-safe:
// write(2) and _exit(2) only. Inside an HDF5 read of a file (file_being_read() names it) the file
// is the cause: bad input, status 2; anywhere else it is cpdrift-inspect's own fault, status 3,
// and no file is blamed. The executable's only: tests and the fuzz target keep the default
// behaviour, so a fault there is seen.
void say(std::initializer_list<const char*> parts) {
  for (const char* s : parts) {
    for (std::size_t n = std::strlen(s); n > 0;) {
      const ssize_t w = ::write(STDERR_FILENO, s, n);
      if (w <= 0) break;
      s += w;
      n -= static_cast<std::size_t>(w);
    }
  }
}

void on_fault(int signal) {
  const char* name = signal == SIGSEGV  ? "SIGSEGV"
                     : signal == SIGBUS ? "SIGBUS"
                     : signal == SIGFPE ? "SIGFPE"
                     : signal == SIGILL ? "SIGILL"
                                        : "SIGABRT";
  const char* file = cpd::inspect::file_being_read();
  if (*file == '\0') {
    say({"cpdrift-inspect: error: internal error (", name,
         "), not caused by the file: please report it\n"});
    ::_exit(3);
  }
  say({"cpdrift-inspect: error: ", file, ": the HDF5 library faulted (", name,
       ") reading this file: its metadata is corrupted\n"});
  ::_exit(2);
}

void install_fault_guard() {
  // On an alternate stack: a fault from a runaway recursion has no stack left to run it on.
  static char stack[1 << 16];
  stack_t alt{};
  alt.ss_sp = stack;
  alt.ss_size = sizeof stack;
  ::sigaltstack(&alt, nullptr);
  struct sigaction action {};
  action.sa_handler = on_fault;
  action.sa_flags = SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (const int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::sigaction(s, &action, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  // A file past `ulimit -f` fails its write, which is reported, instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  install_fault_guard();
  const std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  return cpd::inspect::inspect_main(args, stdout, stderr);
}
