// Under mpirun with a GPU (suite gpu; every process exits 77 without one), built with NCCL:
// processes that share a GPU are refused on every process, with one clear line, before NCCL
// starts (NCCL itself would refuse them later, less clearly).
#include <doctest/doctest.h>

#include "core/errors.h"
#include "gpu_transport_support.h"

using namespace cpd;

TEST_CASE("NCCL refuses processes that share a GPU, on every process, before it starts") {
  GpuTransportOptions shared = testing::gpu_options();
  shared.device = 0;  // every process on device 0
  CHECK_THROWS_WITH_AS(make_nccl_transport(testing::comm(), shared),
                       doctest::Contains("share one GPU"), UsageError);
}
