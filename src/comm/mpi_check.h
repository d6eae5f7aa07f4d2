// CPD_MPI_CHECK: every MPI call checked, one shape for every library (core/errors.h).
#pragma once

#include <mpi.h>

#include "core/errors.h"

namespace cpd {

/// Throws the LibraryError of a failed MPI call, with MPI's own text for `code`.
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);

}  // namespace cpd

#define CPD_MPI_CHECK(call)                                               \
  do {                                                                    \
    const int cpd_mpi_status_ = (call);                                   \
    if (cpd_mpi_status_ != MPI_SUCCESS) {                                 \
      ::cpd::throw_mpi_error(cpd_mpi_status_, #call, __FILE__, __LINE__); \
    }                                                                     \
  } while (0)
