// Under mpirun with a GPU (suite gpu; every process exits 77 without one): the GPU transports
// against the MPI transport. Every protocol gives the same bits over mpi, cuda_ipc and nccl,
// and three repeats give the same digests; NCCL refuses processes that share a GPU up front.
#include <doctest/doctest.h>

#include "case_digests.h"
#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/comm/gpu_transports.h"
#include "cpdrift/core/errors.h"
#include "mpi_support.h"

using namespace cpd;
using cpd::testing::comm;

namespace {

GpuTransportOptions gpu_options() {
  GpuTransportOptions o;
  o.device = comm().local_rank() % cuda_device_count();
  o.timeout_seconds = 120;
  o.staging_bytes = std::uint64_t{1} << 20;  // small: the exchange must take several rounds
  return o;
}

bool devices_shared() { return cuda_device_count() < comm().local_size(); }

testing::Digests run(const CaseSpec& spec, const PathSpec& path, Transport& transport) {
  ThreadPool pool(2);
  const std::unique_ptr<AttentionBackend> gpu = make_cuda_backend(gpu_options().device);
  const Problem p = testing::small_problem();
  InputStore inputs(p, pool, *gpu);
  const CaseGrid grid(p, spec);
  return testing::digests_of(grid, run_protocol(grid, path, transport, inputs, false),
                             comm().collectives(), comm().size(), comm().rank());
}

const std::vector<CaseSpec> kSpecs = {
    CaseSpec{2, 2, 4, CpLayout::contiguous, Protocol::ag_rs},
    CaseSpec{1, 4, 8, CpLayout::zigzag, Protocol::ring_kv},
    CaseSpec{2, 2, std::nullopt, CpLayout::contiguous, Protocol::allgather_kv},
};

}  // namespace

TEST_CASE("cuda_ipc and nccl move the same bits as mpi, for every protocol, three times over") {
  const std::unique_ptr<Transport> mpi = make_mpi_transport(comm());
  std::vector<std::unique_ptr<Transport>> gpu;
  gpu.push_back(make_cuda_ipc_transport(comm(), gpu_options()));
  if (!nccl_transport_built())
    MESSAGE("nccl not compared: this build has no NCCL transport (-Dnccl)");
  else if (devices_shared())
    MESSAGE("nccl not compared: processes share a GPU (NCCL refuses it; see the next test)");
  else
    gpu.push_back(make_nccl_transport(comm(), gpu_options()));
  for (const CaseSpec& spec : kSpecs) {
    for (const PathSpec& path : {testing::kFp32, testing::kBf16Kernel}) {
      const testing::Digests reference = run(spec, path, *mpi);
      for (const std::unique_ptr<Transport>& t : gpu) {
        for (int repeat = 0; repeat < 3; ++repeat) {
          const testing::Digests d = run(spec, path, *t);
          if (comm().rank() != 0) continue;
          CAPTURE(t->name());
          CAPTURE(case_name(spec, DType::fp32));
          CHECK(d.out == reference.out);
          CHECK(d.lse == reference.lse);
        }
      }
    }
  }
  CHECK(gpu.front()->counters().remote_bytes > 0);  // it did carry the traffic between processes
}

TEST_CASE("NCCL refuses processes that share a GPU, on every process, before it starts" *
          doctest::skip(!nccl_transport_built())) {
  GpuTransportOptions shared = gpu_options();
  shared.device = 0;  // every process on device 0
  CHECK_THROWS_WITH_AS(make_nccl_transport(comm(), shared), doctest::Contains("share one GPU"),
                       UsageError);
}
