// The GPU transports (design §4): `nccl`, NCCL bootstrapped from MPI with grouped
// ncclSend/ncclRecv; `cuda_ipc`, cpdrift's own exchange through CUDA IPC windows on one node.
// Both move the messages packed per peer (packed_messages.h); every transport delivers the same
// headers and payloads, so every protocol gives the same bits over every transport. Built with the
// CUDA backend only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/comm_context.h"

namespace cpd {

struct GpuTransportOptions {
  int device = 0;                                         // this process's CUDA device
  double timeout_seconds = 300.0;                         // --comm-timeout
  std::uint64_t staging_bytes = std::uint64_t{64} << 20;  // cuda_ipc: the receive window
};

/// Throws UsageError when built without CUDA, when two processes share a device (NCCL
/// refuses it), or when NCCL cannot start within the timeout.
std::unique_ptr<Transport> make_nccl_transport(const CommContext& comm,
                                               const GpuTransportOptions& options);

/// Whether this build has the NCCL transport (a CUDA build finds NCCL beside the toolkit;
/// -Dnccl=disabled or a toolkit without it builds the CUDA backend without it).
bool nccl_transport_built();
/// NCCL's version as "major.minor.patch", or "" when built without NCCL.
std::string nccl_library_version();

/// Throws UsageError when built without CUDA or when the processes are not all on one node.
std::unique_ptr<Transport> make_cuda_ipc_transport(const CommContext& comm,
                                                   const GpuTransportOptions& options);

/// "" when every process has its own device, else one line naming the processes that share
/// one. `device_ids[p]`: process p's device identity (its UUID).
std::string shared_device_error(const std::vector<std::string>& device_ids);

/// The rounds a windowed exchange needs to move every buffer through slots of `slot_bytes`:
/// ⌈largest buffer / slot_bytes⌉ (0 when nothing moves). `sizes`: the byte counts every
/// process sends every other.
std::uint64_t exchange_rounds(std::span<const std::uint64_t> sizes, std::uint64_t slot_bytes);

/// The slot of each sender in a receive window of `window_bytes` shared by `world` senders:
/// an equal share, rounded down to 256 bytes. Throws UsageError when it is empty.
std::uint64_t window_slot_bytes(std::uint64_t window_bytes, int world);

}  // namespace cpd
