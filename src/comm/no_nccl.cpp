// A CUDA build without NCCL (-Dnccl=disabled, or a toolkit without libnccl): the nccl
// transport is an error the user can act on; cuda_ipc and mpi still work.
#include "comm/gpu_transports.h"
#include "core/errors.h"

namespace cpd {

std::unique_ptr<Transport> make_nccl_transport(const CommContext&, const GpuTransportOptions&) {
  throw UsageError(
      "--transport nccl: built without NCCL (configure with -Dnccl=enabled where libnccl is "
      "installed beside the CUDA Toolkit); --transport cuda_ipc or mpi work in this build");
}

bool nccl_transport_built() { return false; }
std::string nccl_library_version() { return ""; }

}  // namespace cpd
