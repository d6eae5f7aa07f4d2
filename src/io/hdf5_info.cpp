#include "io/hdf5_info.h"

#if defined(CPD_HAVE_HDF5)
#include <hdf5.h>
#endif

namespace cpd {

std::string hdf5_library_version() {
#if defined(CPD_HAVE_HDF5)
  unsigned major = 0, minor = 0, release = 0;
  if (H5get_libversion(&major, &minor, &release) < 0) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
#else
  return "";
#endif
}

}  // namespace cpd
