// A build without the CUDA backend: the GPU transports are an error the user can act on.
#include "comm/gpu_transports.h"
#include "core/errors.h"

namespace cpd {

std::unique_ptr<Transport> make_nccl_transport(const CommContext&, const GpuTransportOptions&) {
  throw UsageError("--transport nccl: built without CUDA (configure with -Dcuda=enabled)");
}

std::unique_ptr<Transport> make_cuda_ipc_transport(const CommContext&, const GpuTransportOptions&) {
  throw UsageError("--transport cuda_ipc: built without CUDA (configure with -Dcuda=enabled)");
}

bool nccl_transport_built() { return false; }
std::string nccl_library_version() { return ""; }

}  // namespace cpd
