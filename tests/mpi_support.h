// Test support for MPI tests: the process's CommContext (created by mpi_main.cpp).
#pragma once

#include "comm/comm_context.h"

namespace cpd::testing {

const CommContext& comm();

}  // namespace cpd::testing
