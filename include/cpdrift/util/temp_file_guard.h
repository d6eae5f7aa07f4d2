// A temporary output file that must not outlive an interrupted run: while registered, SIGINT,
// SIGTERM and SIGHUP (Ctrl-C, mpirun ending a failed job, a lost terminal) unlink it before the
// process dies of the signal. One file at a time per process (the dump being written).
#pragma once

#include <string>

namespace cpd {

class TempFileGuard {
 public:
  /// Registers `path` (replacing any registered one) and installs the handlers once.
  explicit TempFileGuard(const std::string& path);
  /// Unregisters it: the file was renamed into place or removed.
  ~TempFileGuard();
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
};

}  // namespace cpd
