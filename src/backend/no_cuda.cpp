// A build without the CUDA backend: asking for it is an error the user can act on.
#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/comm/gpu_transports.h"
#include "cpdrift/core/errors.h"

namespace cpd {

std::unique_ptr<AttentionBackend> make_cuda_backend(int) {
  throw UsageError("--device cuda: built without CUDA (configure with -Dcuda=enabled)");
}

std::vector<DeviceBenchFigure> cuda_bench(const Problem&, int, int) {
  throw UsageError("bench --device cuda: built without CUDA (configure with -Dcuda=enabled)");
}

std::unique_ptr<Transport> make_nccl_transport(const CommContext&, const GpuTransportOptions&) {
  throw UsageError("--transport nccl: built without CUDA (configure with -Dcuda=enabled)");
}

std::unique_ptr<Transport> make_cuda_ipc_transport(const CommContext&, const GpuTransportOptions&) {
  throw UsageError("--transport cuda_ipc: built without CUDA (configure with -Dcuda=enabled)");
}

bool cuda_backend_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_runtime_version() { return ""; }
bool nccl_transport_built() { return false; }
std::string nccl_library_version() { return ""; }

}  // namespace cpd
