// HDF5 tensor dumps: one FP32 dataset per tensor, written a (b, h, token range) hyperslab at a
// time by rank 0, into a temporary file renamed into place when complete.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/util/partial_files.h"
#include "core/util/temp_file_guard.h"
#include "io/h5_support.h"
#include "io/tensor_dump.h"

namespace cpd {
namespace {

using h5::Handle;

class Hdf5Dump final : public TensorDump {
 public:
  explicit Hdf5Dump(const std::string& path) : path_(path), temp_(partial_path(path)) {
    // HDF5 closes what is still open when the process exits; a file whose close failed (a full
    // disk) makes that crash in HDF5 1.10, after the error was reported. The OS closes it.
    H5dont_atexit();
    h5::silence_errors();  // errors become exceptions, not stderr noise
    const hid_t file = H5Fcreate(temp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) {
      H5Eclear2(H5E_DEFAULT);
      throw std::runtime_error("cannot create dump \"" + path + "\" (temporary \"" + temp_ + "\")");
    }
    file_ = Handle(file);
    parents_ = Handle(CPD_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
    CPD_H5_CHECK(H5Pset_create_intermediate_group(parents_.get(), 1));
  }

  ~Hdf5Dump() override {
    if (committed_) return;
    dataset_.close();
    file_.close();
    std::remove(temp_.c_str());
  }

  void annotate(const std::string& group, const DumpAttributes& attributes) override {
    naming_the_dump([&] {
      const Handle g = ensure_group(group);
      for (const auto& [name, value] : attributes) h5::write_attribute(g.get(), name, value);
    });
  }

  void begin(const std::string& path, const std::vector<std::int64_t>& dims,
             const DumpAttributes& attributes) override {
    naming_the_dump([&] {
      dims_.assign(dims.begin(), dims.end());
      const Handle space(
          CPD_H5_CHECK(H5Screate_simple(static_cast<int>(dims_.size()), dims_.data(), nullptr)));
      dataset_ =
          Handle(CPD_H5_CHECK(H5Dcreate2(file_.get(), path.c_str(), H5T_IEEE_F32LE, space.get(),
                                         parents_.get(), H5P_DEFAULT, H5P_DEFAULT)));
      for (const auto& [name, value] : attributes) h5::write_attribute(dataset_.get(), name, value);
    });
  }

  void write_text(const std::string& path, const std::string& text) override {
    naming_the_dump([&] {
      const Handle type(CPD_H5_CHECK(H5Tcopy(H5T_C_S1)));
      CPD_H5_CHECK(H5Tset_size(type.get(), std::max<std::size_t>(1, text.size())));
      const Handle space(CPD_H5_CHECK(H5Screate(H5S_SCALAR)));
      const Handle data(CPD_H5_CHECK(H5Dcreate2(file_.get(), path.c_str(), type.get(), space.get(),
                                                parents_.get(), H5P_DEFAULT, H5P_DEFAULT)));
      CPD_H5_CHECK(H5Dwrite(data.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, text.c_str()));
    });
  }

  void write(const GlobalPiece& piece, const float* rows) override {
    naming_the_dump([&] {
      // [B, H, S] or [B, H, S, W]: the piece is a contiguous run of S rows.
      std::vector<hsize_t> start{static_cast<hsize_t>(piece.b), static_cast<hsize_t>(piece.h),
                                 static_cast<hsize_t>(piece.tokens.begin)};
      std::vector<hsize_t> count{1, 1, static_cast<hsize_t>(piece.tokens.size())};
      if (dims_.size() == 4) {
        start.push_back(0);
        count.push_back(dims_[3]);
      }
      const Handle file_space(CPD_H5_CHECK(H5Dget_space(dataset_.get())));
      CPD_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                       count.data(), nullptr));
      hsize_t n = 1;
      for (hsize_t c : count) n *= c;
      const Handle mem_space(CPD_H5_CHECK(H5Screate_simple(1, &n, nullptr)));
      CPD_H5_CHECK(H5Dwrite(dataset_.get(), H5T_NATIVE_FLOAT, mem_space.get(), file_space.get(),
                            H5P_DEFAULT, rows));
    });
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

  // Opens a group, creating it and its parents when missing.
  Handle ensure_group(const std::string& path) {
    if (const hid_t group = H5Gopen2(file_.get(), path.c_str(), H5P_DEFAULT); group >= 0)
      return Handle(group);
    H5Eclear2(H5E_DEFAULT);  // missing: created below
    return Handle(CPD_H5_CHECK(
        H5Gcreate2(file_.get(), path.c_str(), parents_.get(), H5P_DEFAULT, H5P_DEFAULT)));
  }

  std::string path_, temp_;
  TempFileGuard guard_{temp_};  // an interrupted run leaves no temporary behind
  Handle file_, dataset_;
  Handle parents_;  // link creation: with the missing parent groups
  std::vector<hsize_t> dims_;
  bool committed_ = false;
};

}  // namespace

bool dump_supported() { return true; }

std::unique_ptr<TensorDump> open_tensor_dump(const std::string& path) {
  return std::make_unique<Hdf5Dump>(path);
}

}  // namespace cpd
