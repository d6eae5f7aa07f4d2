// Failing together: work that may fail on one process (opening a file on rank 0, finding a
// device) ends every process with the same one-line error, before anything else runs.
#pragma once

#include <exception>
#include <string>

#include "comm/comm_context.h"
#include "core/errors.h"

namespace cpd {

/// Runs `work` where `here` is true; what it throws (prefixed) becomes the error every process
/// agrees on and throws as UsageError. Collective.
template <class Work>
void agree_or_throw(const CommContext& comm, bool here, const std::string& prefix, Work&& work) {
  std::string error;
  if (here) {
    try {
      work();
    } catch (const std::exception& e) {
      error = prefix + e.what();
    }
  }
  error = comm.agree(error);
  if (!error.empty()) throw UsageError(error);
}

}  // namespace cpd
