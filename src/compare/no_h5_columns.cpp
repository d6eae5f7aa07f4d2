// Built without HDF5: an HDF5 stream is refused with one line.
#include "compare/logprob_stream.h"
#include "core/errors.h"

namespace cpd::stream_io {

void read_hdf5_columns(const std::string& path, LogprobStream&) {
  throw UsageError(path +
                   ": an HDF5 file, and this cpdrift was built without HDF5 (use JSON "
                   "Lines or a directory of .npy columns)");
}

}  // namespace cpd::stream_io
