// Test support for the GPU transport tests under mpirun: each process's device options, and the
// digests of one protocol run over a transport.
#pragma once

#include <memory>
#include <vector>

#include "case_digests.h"
#include "comm/gpu_transports.h"
#include "kernels/attention_backend.h"
#include "mpi_support.h"

namespace cpd::testing {

inline GpuTransportOptions gpu_options() {
  GpuTransportOptions o;
  o.device = comm().local_rank() % cuda_device_count();
  o.timeout_seconds = 120;
  o.staging_bytes = std::uint64_t{1} << 20;  // small: the exchange must take several rounds
  return o;
}

/// The digests of `spec` on `path` with the CUDA backend over `transport`.
inline Digests gpu_run(const CaseSpec& spec, const PathSpec& path, Transport& transport) {
  ThreadPool pool(2);
  const std::unique_ptr<AttentionBackend> gpu = make_cuda_backend(gpu_options().device);
  const Problem p = small_problem();
  InputStore inputs(p, pool, *gpu);
  const CaseGrid grid(p, spec);
  return digests_of(grid, run_protocol(grid, path, transport, inputs, {}), comm().collectives(),
                    comm().size(), comm().rank());
}

inline const std::vector<CaseSpec> kGpuTransportSpecs = {
    CaseSpec{2, 2, 4, CpLayout::contiguous, Protocol::ag_rs},
    CaseSpec{1, 4, 8, CpLayout::zigzag, Protocol::ring_kv},
    CaseSpec{2, 2, std::nullopt, CpLayout::contiguous, Protocol::allgather_kv},
};

/// Every protocol of kGpuTransportSpecs gives over `gpu` the bits it gives over MPI, three
/// times over (rank 0 compares the digests).
inline void check_same_bits_as_mpi(Transport& gpu) {
  const std::unique_ptr<Transport> mpi = make_mpi_transport(comm());
  for (const CaseSpec& spec : kGpuTransportSpecs) {
    for (const PathSpec& path : {kFp32, kBf16Kernel}) {
      const Digests reference = gpu_run(spec, path, *mpi);
      for (int repeat = 0; repeat < 3; ++repeat) {
        const Digests d = gpu_run(spec, path, gpu);
        if (comm().rank() != 0) continue;
        CAPTURE(gpu.name());
        CAPTURE(case_name(spec, testing::problem_in(DType::fp32)));
        CAPTURE(repeat);
        CHECK(d.out == reference.out);
        CHECK(d.lse == reference.lse);
      }
    }
  }
  CHECK(gpu.counters().remote_bytes > 0);  // it did carry the traffic between processes
}

}  // namespace cpd::testing
