// An owned HDF5 id, for the sources that call HDF5 (the dump writer, cpdrift-inspect's reader):
// only they include this header, and with it <hdf5.h>.
#pragma once

#include <hdf5.h>

namespace cpd::h5io {

/// Owns one HDF5 id and closes it with the matching function (H5Fclose, H5Dclose, …).
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = -1;
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  void reset() { close(); }
  /// Closes the id now; the close's status (a close can be where buffered data is written).
  herr_t close() {
    const herr_t status = id_ >= 0 && close_ != nullptr ? close_(id_) : 0;
    id_ = -1;
    return status;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

}  // namespace cpd::h5io
