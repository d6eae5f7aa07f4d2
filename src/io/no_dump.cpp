// Built without HDF5: --dump is refused before any work starts.
#include "core/errors.h"
#include "io/hdf5_info.h"
#include "io/tensor_dump.h"

namespace cpd {

std::string hdf5_library_version() { return ""; }

bool dump_supported() { return false; }

std::unique_ptr<TensorDump> open_tensor_dump(const std::string&) {
  throw UsageError(
      "--dump: built without HDF5 (install libhdf5-dev and reconfigure with -Dhdf5=enabled)");
}

}  // namespace cpd
