// Built without HDF5: an HDF5 input file is refused with one line.
#include "core/errors.h"
#include "inputs/file_inputs.h"

namespace cpd::input_files {

void open_hdf5(const std::string& path, const ModelDims&, FileInputs&) {
  throw UsageError("--inputs " + path +
                   ": an HDF5 file, and this cpdrift was built without HDF5 (use safetensors or "
                   "a directory of .npy files)");
}

}  // namespace cpd::input_files
