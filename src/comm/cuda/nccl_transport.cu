// `--transport nccl`: rank 0's ncclUniqueId travels by MPI broadcast, every process joins a
// non-blocking communicator on its device, and a superstep is one NCCL group of ncclSend /
// ncclRecv of the packed bytes (packed_messages.h) between device staging buffers. Nothing
// is reduced by NCCL: the bits are the MPI transport's. Every wait polls the communicator's
// async error under --comm-timeout; a failure aborts the communicator (peers then fail their
// own waits, at the latest after --comm-timeout) instead of waiting on it.
#include <chrono>
#include <exception>
#include <thread>

#include "comm/cuda/nccl_check.cuh"
#include "comm/gpu_transports.h"
#include "comm/packed_messages.h"
#include "core/errors.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_buffer.cuh"

namespace cpd {
namespace {

using Clock = std::chrono::steady_clock;

class NcclTransport final : public PackedTransport {
 public:
  NcclTransport(const CommContext& comm, const GpuTransportOptions& o)
      : PackedTransport(comm), options_(o) {
    aborting_on_failure([&] { init(comm, o); });
  }

  ~NcclTransport() override {
    // ncclCommDestroy waits for what is still in flight: a superstep left unfinished, or the
    // unwinding of a failure that did not pass through start()/finish(), aborts instead.
    if (nccl_ != nullptr) {
      in_flight_ || std::uncaught_exceptions() > 0 ? ncclCommAbort(nccl_) : ncclCommDestroy(nccl_);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "nccl"; }

  void start(std::vector<Message> outgoing) override {
    aborting_on_failure([&] { start_superstep(std::move(outgoing)); });
  }

  std::vector<Message> finish() override {
    std::vector<Message> messages;
    aborting_on_failure([&] { messages = finish_superstep(); });
    return messages;
  }

 private:
  // Runs `work`; whatever it throws aborts the communicator first, so peers fail too.
  template <class Work>
  void aborting_on_failure(Work&& work) {
    try {
      work();
    } catch (...) {
      if (nccl_ != nullptr) {
        ncclCommAbort(nccl_);
        nccl_ = nullptr;
      }
      throw;
    }
  }

  void init(const CommContext& comm, const GpuTransportOptions& o) {
    CPD_CUDA_CHECK(cudaSetDevice(o.device));
    cudaDeviceProp prop{};
    CPD_CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
    // NCCL refuses two ranks on one device: say so before it does, on every process.
    const std::string error = comm.agree(
        shared_device_error(comm.allgather(std::string(prop.uuid.bytes, sizeof prop.uuid.bytes))));
    if (!error.empty())
      throw UsageError("--transport nccl: " + error + "; use --transport cuda_ipc or mpi");
    ncclUniqueId id{};
    if (comm.rank() == 0) CPD_NCCL_CHECK(ncclGetUniqueId(&id));
    const std::string bytes = comm.broadcast(std::string(id.internal, sizeof id.internal), 0);
    std::copy(bytes.begin(), bytes.end(), id.internal);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a stuck peer is a timeout, not a hang
    CPD_NCCL_CHECK(ncclCommInitRankConfig(&nccl_, comm.size(), id, comm.rank(), &config));
    wait_for_comm("ncclCommInitRankConfig", "every process of the job");
    CPD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  void start_superstep(std::vector<Message> outgoing) {
    pack_and_size(std::move(outgoing));
    const int world = comm_.size();
    std::uint64_t send_total = 0, recv_total = 0;
    for (int p = 0; p < world; ++p) {
      send_total += send_sizes_[static_cast<std::size_t>(p)];
      recv_total += recv_sizes_[static_cast<std::size_t>(p)];
    }
    if (dev_send_.size() < send_total) dev_send_.resize(send_total);
    if (dev_recv_.size() < recv_total) dev_recv_.resize(recv_total);
    std::uint64_t at = 0;
    for (int p = 0; p < world; ++p) {
      const auto& buf = send_[static_cast<std::size_t>(p)];
      if (!buf.empty()) {
        CPD_CUDA_CHECK(cudaMemcpyAsync(dev_send_.data() + at, buf.data(), buf.size(),
                                       cudaMemcpyHostToDevice, stream_));
      }
      at += buf.size();
    }
    CPD_NCCL_CHECK(ncclGroupStart());
    try {
      std::uint64_t s = 0, r = 0;
      for (int p = 0; p < world; ++p) {
        const auto i = static_cast<std::size_t>(p);
        if (send_sizes_[i] > 0) {
          CPD_NCCL_CHECK(
              ncclSend(dev_send_.data() + s, send_sizes_[i], ncclUint8, p, nccl_, stream_));
        }
        if (recv_sizes_[i] > 0) {
          CPD_NCCL_CHECK(
              ncclRecv(dev_recv_.data() + r, recv_sizes_[i], ncclUint8, p, nccl_, stream_));
        }
        s += send_sizes_[i];
        r += recv_sizes_[i];
      }
    } catch (...) {
      ncclGroupEnd();  // the thread's group closes before the communicator is aborted
      throw;
    }
    CPD_NCCL_CHECK(ncclGroupEnd());
    in_flight_ = true;
  }

  std::vector<Message> finish_superstep() {
    wait_for_stream("the superstep's grouped ncclSend/ncclRecv");
    in_flight_ = false;
    std::vector<std::vector<std::byte>> received(recv_sizes_.size());
    std::uint64_t at = 0;
    for (std::size_t p = 0; p < recv_sizes_.size(); ++p) {
      received[p].resize(recv_sizes_[p]);
      if (!received[p].empty()) dev_recv_.download(received[p].data(), received[p].size(), at);
      at += recv_sizes_[p];
    }
    return arrived(received);
  }

  std::string peers() const {
    std::string list;
    for (std::size_t p = 0; p < send_sizes_.size(); ++p) {
      if (send_sizes_[p] > 0 || recv_sizes_[p] > 0)
        list += (list.empty() ? "" : ", ") + std::to_string(p);
    }
    return list.empty() ? "none" : list;
  }

  // Until the communicator leaves "in progress", polling its async error under the timeout.
  void wait_for_comm(const char* op, const std::string& who) {
    const auto started = Clock::now();
    while (true) {
      ncclResult_t state = ncclSuccess;
      CPD_NCCL_CHECK(ncclCommGetAsyncError(nccl_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress)
        CPD_NCCL_FAIL(op, "with " + who + ": " + nccl_error_text(state, nccl_));
      if (std::chrono::duration<double>(Clock::now() - started).count() >
          options_.timeout_seconds) {
        CPD_NCCL_FAIL(op, "with " + who + ": no progress in " +
                              std::to_string(options_.timeout_seconds) + " s (--comm-timeout)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // Until the stream drains, watching NCCL's async error and the timeout.
  void wait_for_stream(const char* op) {
    const auto started = Clock::now();
    while (true) {
      const cudaError_t s = cudaStreamQuery(stream_);
      if (s == cudaSuccess) return;
      if (s != cudaErrorNotReady)
        throw_cuda_error("CUDA", op, cudaGetErrorString(s), __FILE__, __LINE__);
      ncclResult_t state = ncclSuccess;
      CPD_NCCL_CHECK(ncclCommGetAsyncError(nccl_, &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        CPD_NCCL_FAIL(op, "with processes " + peers() + ": " + nccl_error_text(state, nccl_));
      }
      if (std::chrono::duration<double>(Clock::now() - started).count() >
          options_.timeout_seconds) {
        CPD_NCCL_FAIL(op, "with processes " + peers() + ": not complete after " +
                              std::to_string(options_.timeout_seconds) + " s (--comm-timeout)");
      }
      std::this_thread::yield();
    }
  }

  GpuTransportOptions options_;
  ncclComm_t nccl_ = nullptr;
  bool in_flight_ = false;  // a superstep's sends and receives were launched, not yet waited for
  cudaStream_t stream_ = nullptr;
  DeviceBuffer<std::byte> dev_send_, dev_recv_;  // grow-only staging
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(const CommContext& comm,
                                               const GpuTransportOptions& options) {
  return std::make_unique<NcclTransport>(comm, options);
}

bool nccl_transport_built() { return true; }

std::string nccl_library_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // NCCL ≥ 2.9 encodes major·10000 + minor·100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
         std::to_string(v % 100);
}

}  // namespace cpd
