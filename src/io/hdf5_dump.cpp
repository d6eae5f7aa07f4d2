// HDF5 tensor dumps: one FP32 dataset per tensor, written a (b, h, token range) hyperslab at a
// time by rank 0, into a temporary file renamed into place when complete.
#include <hdf5.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/util/partial_files.h"
#include "core/util/temp_file_guard.h"
#include "io/h5_handle.h"
#include "io/tensor_dump.h"

namespace cpd {

namespace {

// HDF5's error stack, walked upward: from the most specific description of the failure to the
// API call's own.
herr_t take_message(unsigned, const H5E_error2_t* e, void* out) {
  if (e->desc != nullptr && *e->desc != '\0')
    static_cast<std::vector<std::string>*>(out)->push_back(e->desc);
  return 0;
}

// The operating system's words for a failed read or write in HDF5's stack ("No space left on
// device", "File too large"): its file drivers put them in as "error message = '…'".
std::string os_error(const std::vector<std::string>& stack) {
  static const std::string kMarker = "error message = '";
  for (const std::string& m : stack) {
    const std::size_t at = m.find(kMarker);
    if (at == std::string::npos) continue;
    const std::size_t begin = at + kMarker.size(), end = m.find('\'', begin);
    return m.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  }
  return "";
}

// "<the API's message>: <the most specific one>", e.g. "unable to create dataset: name already
// exists"; a failed write ends with the system's reason ("…: No space left on device").
[[noreturn]] void throw_h5_error(const char* call, const char* file, int line) {
  std::vector<std::string> stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_message, &stack);
  H5Eclear2(H5E_DEFAULT);
  std::string message = stack.empty() ? "unknown HDF5 error" : stack.back();
  if (const std::string os = os_error(stack); !os.empty()) {
    message += ": " + os;  // the driver's own description spans lines and says no more
  } else if (stack.size() > 1 && stack.front() != stack.back()) {
    message += ": " + stack.front();
  }
  throw_library_error("HDF5", call, message, file, line);
}

}  // namespace
}  // namespace cpd

// CPD_H5_CHECK: every HDF5 call checked, one shape for every library (style habit 3): a
// negative id or status becomes a LibraryError with HDF5's messages.
#define CPD_H5_CHECK(call)                                                    \
  ([&]() {                                                                    \
    const auto cpd_h5_result_ = (call);                                       \
    if (cpd_h5_result_ < 0) ::cpd::throw_h5_error(#call, __FILE__, __LINE__); \
    return cpd_h5_result_;                                                    \
  }())

namespace cpd {
namespace {

using h5io::Handle;

void write_attribute(hid_t object, const std::string& name, const DumpValue& value) {
  const Handle space(CPD_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  if (const auto* s = std::get_if<std::string>(&value)) {
    const Handle type(CPD_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
    CPD_H5_CHECK(H5Tset_size(type.get(), std::max<std::size_t>(1, s->size())));
    const Handle attr(CPD_H5_CHECK(H5Acreate2(object, name.c_str(), type.get(), space.get(),
                                              H5P_DEFAULT, H5P_DEFAULT)),
                      H5Aclose);
    CPD_H5_CHECK(H5Awrite(attr.get(), type.get(), s->empty() ? "" : s->c_str()));
  } else if (const auto* i = std::get_if<std::int64_t>(&value)) {
    const Handle attr(CPD_H5_CHECK(H5Acreate2(object, name.c_str(), H5T_STD_I64LE, space.get(),
                                              H5P_DEFAULT, H5P_DEFAULT)),
                      H5Aclose);
    CPD_H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_INT64, i));
  } else {
    const double d = std::get<double>(value);
    const Handle attr(CPD_H5_CHECK(H5Acreate2(object, name.c_str(), H5T_IEEE_F64LE, space.get(),
                                              H5P_DEFAULT, H5P_DEFAULT)),
                      H5Aclose);
    CPD_H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &d));
  }
}

class Hdf5Dump final : public TensorDump {
 public:
  explicit Hdf5Dump(const std::string& path) : path_(path), temp_(partial_path(path)) {
    // HDF5 closes what is still open when the process exits; a file whose close failed (a full
    // disk) makes that crash in HDF5 1.10, after the error was reported. The OS closes it.
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors become exceptions, not stderr noise
    const hid_t file = H5Fcreate(temp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) {
      H5Eclear2(H5E_DEFAULT);
      throw std::runtime_error("cannot create dump \"" + path + "\" (temporary \"" + temp_ + "\")");
    }
    file_ = Handle(file, H5Fclose);
  }

  ~Hdf5Dump() override {
    if (committed_) return;
    dataset_.reset();
    file_.reset();
    std::remove(temp_.c_str());
  }

  void annotate(const std::string& group, const DumpAttributes& attributes) override {
    naming_the_dump([&] {
      const Handle g = ensure_group(group);
      for (const auto& [name, value] : attributes) write_attribute(g.get(), name, value);
    });
  }

  void begin(const std::string& path, const std::vector<std::int64_t>& dims,
             const DumpAttributes& attributes) override {
    naming_the_dump([&] { begin_dataset(path, dims, attributes); });
  }

  void write_text(const std::string& path, const std::string& text) override {
    naming_the_dump([&] { write_text_dataset(path, text); });
  }

  void write(const GlobalPiece& piece, const float* rows) override {
    naming_the_dump([&] { write_rows(piece, rows); });
  }

  void end() override {
    naming_the_dump([&] { CPD_H5_CHECK(dataset_.close()); });
  }

  void commit() override {
    naming_the_dump([&] {
      CPD_H5_CHECK(dataset_.close());
      CPD_H5_CHECK(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL));
      CPD_H5_CHECK(file_.close());
    });
    if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
      throw std::runtime_error("cannot rename dump \"" + temp_ + "\" to \"" + path_ + "\"");
    }
    committed_ = true;
  }

 private:
  // Runs `f`; a failed HDF5 call in it says which dump it was writing, and why first:
  // `cannot write dump "d.h5": No space left on device (<the call that failed>)`.
  template <class F>
  void naming_the_dump(F&& f) {
    try {
      f();
    } catch (const LibraryError& e) {
      const std::string what = e.what();
      static const std::string kMarker = ": ";
      const std::size_t last = what.rfind(kMarker);
      const std::string why = last == std::string::npos ? what : what.substr(last + 2);
      throw LibraryError("HDF5", "cannot write dump \"" + path_ + "\": " + why + " (" + what + ")");
    }
  }

  void begin_dataset(const std::string& path, const std::vector<std::int64_t>& dims,
                     const DumpAttributes& attributes) {
    const std::size_t slash = path.rfind('/');
    const Handle parent = ensure_group(path.substr(0, slash == 0 ? 1 : slash));
    dims_.assign(dims.begin(), dims.end());
    const Handle space(
        CPD_H5_CHECK(H5Screate_simple(static_cast<int>(dims_.size()), dims_.data(), nullptr)),
        H5Sclose);
    dataset_ =
        Handle(CPD_H5_CHECK(H5Dcreate2(parent.get(), path.substr(slash + 1).c_str(), H5T_IEEE_F32LE,
                                       space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
               H5Dclose);
    for (const auto& [name, value] : attributes) write_attribute(dataset_.get(), name, value);
  }

  void write_text_dataset(const std::string& path, const std::string& text) {
    const std::size_t slash = path.rfind('/');
    const Handle parent = ensure_group(path.substr(0, slash == 0 ? 1 : slash));
    const Handle type(CPD_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
    CPD_H5_CHECK(H5Tset_size(type.get(), std::max<std::size_t>(1, text.size())));
    const Handle space(CPD_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
    const Handle data(
        CPD_H5_CHECK(H5Dcreate2(parent.get(), path.substr(slash + 1).c_str(), type.get(),
                                space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
        H5Dclose);
    CPD_H5_CHECK(H5Dwrite(data.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, text.c_str()));
  }

  void write_rows(const GlobalPiece& piece, const float* rows) {
    // [B, H, S] or [B, H, S, W]: the piece is a contiguous run of S rows.
    std::vector<hsize_t> start{static_cast<hsize_t>(piece.b), static_cast<hsize_t>(piece.h),
                               static_cast<hsize_t>(piece.tokens.begin)};
    std::vector<hsize_t> count{1, 1, static_cast<hsize_t>(piece.tokens.size())};
    if (dims_.size() == 4) {
      start.push_back(0);
      count.push_back(dims_[3]);
    }
    const Handle file_space(CPD_H5_CHECK(H5Dget_space(dataset_.get())), H5Sclose);
    CPD_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                     count.data(), nullptr));
    hsize_t n = 1;
    for (hsize_t c : count) n *= c;
    const Handle mem_space(CPD_H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
    CPD_H5_CHECK(H5Dwrite(dataset_.get(), H5T_NATIVE_FLOAT, mem_space.get(), file_space.get(),
                          H5P_DEFAULT, rows));
  }

  // Opens a group, creating it and its parents when missing.
  Handle ensure_group(const std::string& path) {
    Handle current(CPD_H5_CHECK(H5Gopen2(file_.get(), "/", H5P_DEFAULT)), H5Gclose);
    std::size_t at = 1;
    while (at < path.size()) {
      const std::size_t next = std::min(path.find('/', at), path.size());
      const std::string name = path.substr(at, next - at);
      const bool exists = CPD_H5_CHECK(H5Lexists(current.get(), name.c_str(), H5P_DEFAULT)) > 0;
      current = Handle(exists ? CPD_H5_CHECK(H5Gopen2(current.get(), name.c_str(), H5P_DEFAULT))
                              : CPD_H5_CHECK(H5Gcreate2(current.get(), name.c_str(), H5P_DEFAULT,
                                                        H5P_DEFAULT, H5P_DEFAULT)),
                       H5Gclose);
      at = next + 1;
    }
    return current;
  }

  std::string path_, temp_;
  TempFileGuard guard_{temp_};  // an interrupted run leaves no temporary behind
  Handle file_, dataset_;
  std::vector<hsize_t> dims_;
  bool committed_ = false;
};

}  // namespace

bool dump_supported() { return true; }

std::unique_ptr<TensorDump> open_tensor_dump(const std::string& path) {
  return std::make_unique<Hdf5Dump>(path);
}

}  // namespace cpd
