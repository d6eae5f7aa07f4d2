// `--transport cuda_ipc`: cpdrift's own exchange between the processes of one node. Each
// process exports a receive window (cudaIpcGetMemHandle), the handles travel by MPI, and
// every process opens its peers' windows. A superstep moves the packed bytes
// (packed_messages.h) in rounds: each sender writes its next chunk into its slot of every
// peer's window, an MPI barrier, each receiver copies its slots out, a barrier. Chunks are
// the slot size (window / processes), so messages of any size pass through a fixed window
// (--staging-mib). Processes sharing one GPU work as well as processes on different GPUs.
#include <algorithm>

#include "comm/gpu_transports.h"
#include "comm/packed_messages.h"
#include "core/errors.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_buffer.cuh"

namespace cpd {
namespace {

class CudaIpcTransport final : public PackedTransport {
 public:
  CudaIpcTransport(const CommContext& comm, const GpuTransportOptions& o) : PackedTransport(comm) {
    const std::string where =
        comm.agree(comm.local_size() == comm.size()
                       ? ""
                       : "--transport cuda_ipc: the processes span more than one node");
    if (!where.empty()) throw UsageError(where + " (use --transport nccl or mpi)");
    slot_ = window_slot_bytes(o.staging_bytes, comm.size());
    CPD_CUDA_CHECK(cudaSetDevice(o.device));
    window_.resize(slot_ * static_cast<std::uint64_t>(comm.size()));
    cudaIpcMemHandle_t handle{};
    CPD_CUDA_CHECK(cudaIpcGetMemHandle(&handle, window_.data()));
    const std::vector<std::string> handles =
        comm.allgather(std::string(reinterpret_cast<const char*>(&handle), sizeof handle));
    peers_.assign(static_cast<std::size_t>(comm.size()), nullptr);
    for (int p = 0; p < comm.size(); ++p) {
      if (p == comm.rank()) continue;
      cudaIpcMemHandle_t h{};
      std::copy(handles[static_cast<std::size_t>(p)].begin(),
                handles[static_cast<std::size_t>(p)].end(), reinterpret_cast<char*>(&h));
      void* ptr = nullptr;
      CPD_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess));
      peers_[static_cast<std::size_t>(p)] = static_cast<std::byte*>(ptr);
    }
    comm.barrier();  // every window is open before anyone writes
  }

  ~CudaIpcTransport() override {
    for (std::byte* p : peers_) {
      if (p != nullptr) cudaIpcCloseMemHandle(p);
    }
  }

  const char* name() const override { return "cuda_ipc"; }

  void start(std::vector<Message> outgoing) override {
    pack_and_size(std::move(outgoing));
    // Every byte count sent is one received: the largest send anywhere sets the rounds.
    std::uint64_t rounds[1] = {exchange_rounds(send_sizes_, slot_)};
    comm_.allreduce_max(rounds);
    rounds_ = rounds[0];
  }

  std::vector<Message> finish() override {
    const int world = comm_.size(), me = comm_.rank();
    std::vector<std::vector<std::byte>> recv(static_cast<std::size_t>(world));
    for (int p = 0; p < world; ++p)
      recv[static_cast<std::size_t>(p)].resize(recv_sizes_[static_cast<std::size_t>(p)]);
    for (std::uint64_t r = 0; r < rounds_; ++r) {
      const std::uint64_t at = r * slot_;
      for (int p = 0; p < world; ++p) {  // my slot in every peer's window
        const std::vector<std::byte>& buf = send_[static_cast<std::size_t>(p)];
        if (p == me || at >= buf.size()) continue;
        const std::uint64_t n = std::min<std::uint64_t>(slot_, buf.size() - at);
        CPD_CUDA_CHECK(
            cudaMemcpy(peers_[static_cast<std::size_t>(p)] + static_cast<std::uint64_t>(me) * slot_,
                       buf.data() + at, n, cudaMemcpyHostToDevice));
      }
      CPD_CUDA_CHECK(cudaDeviceSynchronize());
      comm_.barrier();                   // every chunk of this round has landed
      for (int p = 0; p < world; ++p) {  // every peer's slot in my window
        std::vector<std::byte>& buf = recv[static_cast<std::size_t>(p)];
        if (p == me || at >= buf.size()) continue;
        const std::uint64_t n = std::min<std::uint64_t>(slot_, buf.size() - at);
        window_.download(buf.data() + at, n, static_cast<std::uint64_t>(p) * slot_);
      }
      comm_.barrier();  // every window has been read: the next round may overwrite it
    }
    return arrived(recv);
  }

 private:
  std::uint64_t slot_ = 0, rounds_ = 0;
  DeviceBuffer<std::byte> window_;
  std::vector<std::byte*> peers_;
};

}  // namespace

std::unique_ptr<Transport> make_cuda_ipc_transport(const CommContext& comm,
                                                   const GpuTransportOptions& options) {
  return std::make_unique<CudaIpcTransport>(comm, options);
}

}  // namespace cpd
