// --inject-fault dump-write-error: a dump whose chosen write fails
// (src/io/tensor_dump.h).
#include <stdexcept>

#include "core/errors.h"
#include "io/tensor_dump.h"

namespace cpd {
namespace {

class FaultyDump final : public TensorDump {
 public:
  FaultyDump(std::unique_ptr<TensorDump> inner, std::string path, int when)
      : inner_(std::move(inner)), path_(std::move(path)), when_(when) {}

  void annotate(const std::string& group, const DumpAttributes& attributes) override {
    inner_->annotate(group, attributes);
  }
  void begin(const std::string& path, const std::vector<std::int64_t>& dims,
             const DumpAttributes& attributes) override {
    inner_->begin(path, dims, attributes);
  }
  void write_text(const std::string& path, const std::string& text) override {
    inner_->write_text(path, text);
  }
  void write(const GlobalPiece& piece, const float* rows) override {
    if (++writes_ == when_) {
      // Worded as the HDF5 writer words a refused write, so the same path reports it.
      throw LibraryError("HDF5", "cannot write dump \"" + path_ +
                                     "\": injected write error (--inject-fault "
                                     "dump-write-error@0:" +
                                     std::to_string(when_) + ")");
    }
    inner_->write(piece, rows);
  }
  void end() override { inner_->end(); }
  void commit() override {
    if (writes_ < when_) {
      throw std::runtime_error("--inject-fault dump-write-error@0:" + std::to_string(when_) +
                               ": the dump took only " + std::to_string(writes_) +
                               " writes: nothing was injected");
    }
    inner_->commit();
  }

 private:
  std::unique_ptr<TensorDump> inner_;
  std::string path_;
  int when_;
  int writes_ = 0;
};

}  // namespace

std::unique_ptr<TensorDump> with_write_fault(std::unique_ptr<TensorDump> inner,
                                             const std::string& path, int when) {
  return std::make_unique<FaultyDump>(std::move(inner), path, when);
}

}  // namespace cpd
