// CPD_NCCL_CHECK: every NCCL call checked, one shape for every library: host, rank,
// file:line, NCCL's decoded error and its last message, then a LibraryError.
#pragma once

#include <nccl.h>

#include <string>

#include "core/errors.h"

namespace cpd {

/// NCCL's text for `r`, with the communicator's last error message when it has one.
inline std::string nccl_error_text(ncclResult_t r, ncclComm_t comm = nullptr) {
  std::string text = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

}  // namespace cpd

/// `ncclInProgress` is not a failure: the calls of a non-blocking communicator complete in the
/// wait that follows them.
#define CPD_NCCL_CHECK(call)                                                              \
  do {                                                                                    \
    const ncclResult_t cpd_nccl_status_ = (call);                                         \
    if (cpd_nccl_status_ != ncclSuccess && cpd_nccl_status_ != ncclInProgress) {          \
      ::cpd::throw_library_error("NCCL", #call, ::cpd::nccl_error_text(cpd_nccl_status_), \
                                 __FILE__, __LINE__);                                     \
    }                                                                                     \
  } while (0)

/// A failure NCCL reports outside a call (an async error, a timeout): the same shape.
#define CPD_NCCL_FAIL(what, decoded) \
  ::cpd::throw_library_error("NCCL", what, decoded, __FILE__, __LINE__)
