// Whether this build has HDF5, and which library it links.
#pragma once

#include <string>

namespace cpd {

/// "1.10.8", or "" when built without HDF5 (-Dhdf5=disabled or not found).
std::string hdf5_library_version();

}  // namespace cpd
