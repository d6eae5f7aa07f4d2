// The error types cpdrift reports, and the exit status each maps to.
//
// main() catches them once, prints one line, and ends the job with a status every process
// agrees on: 2 for bad input (nothing ran), 3 for a failure while running (protocol,
// communication, I/O). A completed run whose drift checks fail exits 1.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

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

/// A call into CUDA, cuBLAS, NCCL, MPI or HDF5 failed (docs/style.md). Every check macro
/// (CPD_CUDA_CHECK, CPD_CUBLAS_CHECK, CPD_NCCL_CHECK, CPD_MPI_CHECK, CPD_H5_CHECK) throws it
/// with one shape: "<host> rank <N> <file>:<line>: <call> failed: <the library's decoded error>".
class LibraryError : public std::runtime_error {
 public:
  LibraryError(std::string library, const std::string& message)
      : std::runtime_error(message), library_(std::move(library)) {}
  /// "CUDA", "cuBLAS", "NCCL", "MPI" or "HDF5".
  const std::string& library() const { return library_; }

 private:
  std::string library_;
};

/// Throws the LibraryError of a failed `call` (the check macros' one path).
[[noreturn]] void throw_library_error(const char* library, const char* call,
                                      const std::string& decoded, const char* file, int line);

/// This process's rank in the job, named by every LibraryError (set when MPI starts; -1 before).
void set_error_rank(int rank);

}  // namespace cpd
