// Interrupted runs. A temporary output file that must not outlive an interrupted run: while
// registered, SIGINT, SIGTERM and SIGHUP (Ctrl-C, mpirun ending a failed job, a lost terminal)
// unlink it before the process dies of the signal. One file at a time per process (the dump being
// written).
#pragma once

#include <string>

namespace cpd {

class TempFileGuard {
 public:
  /// Registers `path` (replacing any registered one) and installs the handlers once.
  explicit TempFileGuard(const std::string& path);
  /// Unregisters it: the file was renamed into place or removed.
  ~TempFileGuard();
  TempFileGuard(TempFileGuard&&) = delete;  // one registration: neither copied nor moved
};

/// Installs the same handlers for the whole run: a SIGINT, SIGTERM or SIGHUP ends the process
/// by that signal (the registered temporary unlinked first) and, where `announce` (rank 0),
/// says so on stderr in one line: "cpdrift: interrupted by signal N; no report written".
void handle_interrupts(bool announce);

/// From now on the announcement says "... after its outputs were written": the report (and dump)
/// are in place, as when mpirun ends the other processes of a job whose first process to finish
/// left with a failing status.
void note_outputs_written();

}  // namespace cpd
