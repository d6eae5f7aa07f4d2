// A build without the CUDA backend: asking for it is an error the user can act on.
#include "core/errors.h"
#include "kernels/attention_backend.h"

namespace cpd {

std::unique_ptr<AttentionBackend> make_cuda_backend(int) {
  throw UsageError("--device cuda: built without CUDA (configure with -Dcuda=enabled)");
}

std::vector<DeviceBenchFigure> cuda_bench(const Problem&, int, int) {
  throw UsageError("bench --device cuda: built without CUDA (configure with -Dcuda=enabled)");
}

bool cuda_backend_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_runtime_version() { return ""; }

}  // namespace cpd
