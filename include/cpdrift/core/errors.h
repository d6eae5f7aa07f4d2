// The error types cpdrift reports, and the exit status each maps to.
//
// main() catches them once, prints one line, and ends the job with a status every process
// agrees on: 2 for bad input (nothing ran), 3 for a failure while running (protocol,
// communication, I/O). A completed run whose drift checks fail exits 1.
#pragma once

#include <stdexcept>
#include <string>

namespace cpd {

enum ExitStatus : int { kExitOk = 0, kExitChecksFailed = 1, kExitUsage = 2, kExitRuntime = 3 };

/// Bad command line or an impossible case: detected before any work starts.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A message that contradicts the block manifest: missing, duplicated, unexpected or
/// mis-shaped. Never merged, never ignored.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace cpd
