// Under mpirun, built with NCCL (suite gpu): with a GPU of its own per process (every process
// exits 77 otherwise, since NCCL refuses a shared one) NCCL moves the MPI transport's bits for
// every protocol, three times over.
#include <doctest/doctest.h>

#include "gpu_transport_support.h"

using namespace cpd;

TEST_CASE("nccl moves the same bits as mpi, for every protocol, three times over") {
  const std::unique_ptr<Transport> nccl =
      make_nccl_transport(testing::comm(), testing::gpu_options());
  testing::check_same_bits_as_mpi(*nccl);
}
