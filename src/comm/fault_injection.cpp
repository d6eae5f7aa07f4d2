#include "comm/fault_injection.h"

#include <chrono>
#include <cstdlib>
#include <limits>
#include <thread>

namespace cpd {
namespace {

// Forwards everything to the real transport; on its process, breaks one state message.
class FaultyTransport final : public Transport {
 public:
  FaultyTransport(std::unique_ptr<Transport> inner, const FaultSpec& fault, bool here, bool* fired)
      : inner_(std::move(inner)), fault_(fault), here_(here), fired_(fired) {}

  const char* name() const override { return inner_->name(); }
  int world_size() const override { return inner_->world_size(); }
  int process_index() const override { return inner_->process_index(); }
  std::string agree(const std::string& local_error) override { return inner_->agree(local_error); }
  std::vector<Message> finish() override {
    std::vector<Message> arrived = inner_->finish();
    counters_ = inner_->counters();
    return arrived;
  }

  void start(std::vector<Message> outgoing) override {
    if (here_ && !*fired_) {
      for (std::size_t i = 0; i < outgoing.size(); ++i) {
        if (outgoing[i].header.kind != MessageKind::partial_state) continue;
        if (++seen_ == fault_.when) {
          *fired_ = true;
          apply(outgoing, i);
        }
        break;
      }
    }
    inner_->start(std::move(outgoing));
    counters_ = inner_->counters();
  }

 private:
  void apply(std::vector<Message>& outgoing, std::size_t i) {
    Message& m = outgoing[i];
    switch (fault_.kind) {
      case FaultKind::drop_state:
        outgoing.erase(outgoing.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      case FaultKind::duplicate_state:
        outgoing.push_back(m);
        return;
      case FaultKind::corrupt_lse:  // a state's payload ends with its LSE values
        m.payload.back() = std::numeric_limits<float>::quiet_NaN();
        return;
      case FaultKind::wrong_block_index:
        ++m.header.block_index;
        return;
      case FaultKind::short_message:
        m.payload.pop_back();
        --m.header.floats;
        return;
      case FaultKind::rank_exit:
        std::_Exit(3);  // mid-exchange: the other processes are about to wait for it
      case FaultKind::slow_rank:
        std::this_thread::sleep_for(std::chrono::duration<double>(fault_.slow_seconds));
        return;
      case FaultKind::dump_write_error:  // the dump's (io/tensor_dump.h), never the transport's
        return;
    }
  }

  std::unique_ptr<Transport> inner_;
  FaultSpec fault_;
  bool here_;
  bool* fired_;
  int seen_ = 0;
};

}  // namespace

std::unique_ptr<Transport> with_fault(std::unique_ptr<Transport> inner, const FaultSpec& fault,
                                      int process_rank, bool* fired) {
  return std::make_unique<FaultyTransport>(std::move(inner), fault, process_rank == fault.rank,
                                           fired);
}

}  // namespace cpd
