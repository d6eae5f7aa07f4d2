// HDF5 logprob columns: datasets /sequence, /position, /token_id, /logprob [N] and the optional
// ones (logprob_stream.h); HDF5 converts any integer or float type to what is read.
#include "compare/logprob_stream.h"
#include "core/errors.h"
#include "core/util/sha256.h"
#include "io/h5_support.h"

namespace cpd::stream_io {

void read_hdf5_columns(const std::string& path, LogprobStream& s) {
  const FileDigest digest = sha256_files({path});
  s.files.push_back(SourceFile{path, digest.size_bytes, digest.sha256});
  const h5::Handle file = h5::open_file(path);
  take_columns(
      [&](const std::string& name, bool integers, bool required) -> std::optional<Column> {
        if (!h5::exists(file.get(), name)) {
          if (required) throw UsageError(path + ": no dataset /" + name);
          return std::nullopt;
        }
        const h5::Dataset set(file.get(), "/" + name, path);
        Column c{path + ": /" + name, set.shape(), {}, {}};
        const H5T_class_t cls = set.type_class();
        if (cls != H5T_INTEGER && cls != H5T_FLOAT && cls != H5T_ENUM)
          throw UsageError(c.label + ": must hold numbers");
        if (integers && cls == H5T_FLOAT) throw UsageError(c.label + ": must hold integers");
        if (integers) {
          c.ints = set.read<std::int64_t>();
        } else {
          c.reals = set.read<double>();
        }
        return c;
      },
      s);
}

}  // namespace cpd::stream_io
