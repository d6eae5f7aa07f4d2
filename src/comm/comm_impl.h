// The MPI handles behind CommContext; included by src/comm/ only.
#pragma once

#include <mpi.h>

#include "comm/comm_context.h"

namespace cpd {

struct CommContext::Impl {
  MPI_Comm world = MPI_COMM_NULL;  // cpdrift's duplicate of MPI_COMM_WORLD
  MPI_Comm node = MPI_COMM_NULL;   // the processes sharing this node
};

}  // namespace cpd
