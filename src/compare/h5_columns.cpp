// HDF5 logprob columns: /sequence, /position, /token_id, /logprob [N], optional /active [N] and
// /vocab_logprobs [N, V]; HDF5 converts any integer or float type to what is read.
#include <string>
#include <type_traits>
#include <vector>

#include "compare/logprob_stream.h"
#include "core/errors.h"
#include "io/h5_support.h"

namespace cpd::stream_io {
namespace {

// One dataset's values as T (std::int64_t or double), and its extents in `dims`.
template <class T>
std::vector<T> read_dataset(hid_t file, const std::string& path, const char* name,
                            std::vector<std::int64_t>& dims) {
  const std::string what = path + ": /" + name;
  const h5::Dataset set(file, std::string("/") + name, path);
  const H5T_class_t cls = set.type_class();
  if (cls != H5T_INTEGER && cls != H5T_FLOAT && cls != H5T_ENUM)
    throw UsageError(what + ": must hold numbers");
  if (std::is_integral_v<T> && cls == H5T_FLOAT) throw UsageError(what + ": must hold integers");
  dims = set.shape();
  if (dims.size() < 1 || dims.size() > 2) throw UsageError(what + ": must be 1-D (or [N, V])");
  return set.read<T>();
}

}  // namespace

void read_hdf5_columns(const std::string& path, LogprobStream& s) {
  s.files.push_back(fingerprint(path));
  const h5::Handle file = h5::open_file(path);
  const auto exists = [&](const char* name) { return h5::exists(file.get(), name); };
  for (const char* name : {"sequence", "position", "token_id", "logprob"}) {
    if (!exists(name)) throw UsageError(path + ": no dataset /" + name);
  }
  std::vector<std::int64_t> dims;
  const auto column = [&](const char* name) {
    std::vector<std::int64_t> v = read_dataset<std::int64_t>(file.get(), path, name, dims);
    if (dims.size() != 1) throw UsageError(path + ": /" + std::string(name) + " must be 1-D");
    return v;
  };
  const std::vector<double> logprob = read_dataset<double>(file.get(), path, "logprob", dims);
  if (dims.size() != 1) throw UsageError(path + ": /logprob must be 1-D");
  const std::size_t n = logprob.size();
  const std::vector<std::int64_t> seq = column("sequence"), pos = column("position"),
                                  tok = column("token_id");
  std::vector<std::int64_t> active;
  if (exists("active")) active = column("active");
  using Column = std::pair<const char*, const std::vector<std::int64_t>*>;
  for (const auto& [name, v] : {Column{"sequence", &seq}, Column{"position", &pos},
                                Column{"token_id", &tok}, Column{"active", &active}}) {
    if (v->size() != n && !(v == &active && v->empty())) {
      throw UsageError(path + ": /" + name + " has " + std::to_string(v->size()) +
                       " entries, /logprob " + std::to_string(n));
    }
  }
  if (exists("vocab_logprobs")) {
    s.vocab = read_dataset<double>(file.get(), path, "vocab_logprobs", dims);
    if (dims.size() != 2 || static_cast<std::size_t>(dims[0]) != n || dims[1] == 0)
      throw UsageError(path + ": /vocab_logprobs must be [" + std::to_string(n) + ", V]");
    s.vocab_size = dims[1];
  }
  if (exists("top_ids") != exists("top_logprobs"))
    throw UsageError(path + ": /top_ids and /top_logprobs go together");
  if (exists("top_ids")) {
    const std::vector<std::int64_t> ids =
        read_dataset<std::int64_t>(file.get(), path, "top_ids", dims);
    const std::vector<std::int64_t> id_dims = dims;
    const std::vector<double> lps = read_dataset<double>(file.get(), path, "top_logprobs", dims);
    if (id_dims.size() != 2 || static_cast<std::size_t>(id_dims[0]) != n || dims != id_dims) {
      throw UsageError(path + ": /top_ids and /top_logprobs must both be [" + std::to_string(n) +
                       ", K]");
    }
    take_top_columns(ids, lps, n, static_cast<std::size_t>(id_dims[1]), path, s);
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (const auto* v : {&seq, &pos, &tok}) {
      if ((*v)[i] < 0) {
        throw UsageError(path + " row " + std::to_string(i) + ": " +
                         (v == &seq   ? "sequence"
                          : v == &pos ? "position"
                                      : "token_id") +
                         " is negative");
      }
    }
    LogprobRecord r;
    r.sequence = seq[i];
    r.position = pos[i];
    r.token_id = tok[i];
    r.logprob = logprob[i];
    r.active = active.empty() || active[i] != 0;
    s.records.push_back(r);
    s.vocab_row.push_back(s.vocab_size > 0 ? static_cast<std::int64_t>(i) : -1);
  }
}

}  // namespace cpd::stream_io
