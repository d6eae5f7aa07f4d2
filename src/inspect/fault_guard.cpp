#include "inspect/fault_guard.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

#include "inspect/dump_reader.h"

namespace cpd::inspect {
namespace {

void say(const char* s) {
  for (std::size_t n = std::strlen(s); n > 0;) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

const char* name_of(int signal) {
  return signal == SIGSEGV  ? "SIGSEGV"
         : signal == SIGBUS ? "SIGBUS"
         : signal == SIGFPE ? "SIGFPE"
         : signal == SIGILL ? "SIGILL"
                            : "SIGABRT";
}

// Async-signal-safe: write(2) and _exit(2) only. Inside an HDF5 read of a file (its name set),
// the file is the cause: bad input, status 2; anywhere else it is cpdrift-inspect's own fault,
// status 3, and no file is blamed.
void on_fault(int signal) {
  const char* file = file_being_read();
  say("cpdrift-inspect: error: ");
  if (*file == '\0') {
    say("internal error (");
    say(name_of(signal));
    say("), not caused by the file: please report it\n");
    ::_exit(3);
  }
  say(file);
  say(": the HDF5 library faulted (");
  say(name_of(signal));
  say(") reading this file: its metadata is corrupted\n");
  ::_exit(2);
}

}  // namespace

void install_fault_guard() {
  // A fault from a runaway recursion has no stack left to run the handler on.
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

}  // namespace cpd::inspect
