// Under mpirun with a GPU per process (suite gpu; every process exits 77 without one): the
// project's own CUDA-IPC transport moves the MPI transport's bits for every protocol, three
// times over.
#include <doctest/doctest.h>

#include "gpu_transport_support.h"

using namespace cpd;

TEST_CASE("cuda_ipc moves the same bits as mpi, for every protocol, three times over") {
  const std::unique_ptr<Transport> ipc =
      make_cuda_ipc_transport(testing::comm(), testing::gpu_options());
  testing::check_same_bits_as_mpi(*ipc);
}
