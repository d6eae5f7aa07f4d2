// The one owner of cpdrift's communicators (docs/style.md): MPI's world, duplicated for
// cpdrift, and the node-local rank. Nothing outside src/comm/ calls MPI; this header does
// not include <mpi.h>.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "comm/transport.h"

namespace cpd {

/// Also the run's Collectives over all processes (for the statistics, digests, dumps).
class CommContext final : public Collectives {
 public:
  /// Initialises MPI (thread level FUNNELED: only the main thread communicates) and
  /// duplicates MPI_COMM_WORLD. One per process, alive for the whole program.
  CommContext(int* argc, char*** argv);
  ~CommContext();
  CommContext(const CommContext&) = delete;
  CommContext& operator=(const CommContext&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  /// Rank and process count among the processes of this node (MPI_COMM_TYPE_SHARED).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  /// MPI_Get_library_version, first line.
  std::string library_version() const;

  /// Element-wise sum / max over all processes, in place.
  void allreduce_sum(std::span<std::uint64_t> values) const;
  void allreduce_max(std::span<std::uint64_t> values) const;
  void sum(std::span<std::uint64_t> values) const override { allreduce_sum(values); }
  void max(std::span<std::uint64_t> values) const override { allreduce_max(values); }
  void stream_to_root(std::span<const StreamSegment> segments,
                      const std::function<void(std::size_t, const float*)>& sink) const override;
  /// Logical OR of a flag over all processes.
  bool any(bool flag) const;
  void barrier() const;
  /// Ends every process of the job with `status` (after a failure on one of them).
  [[noreturn]] void abort(int status) const;
  /// From now on a wait for another process longer than `seconds` (0: none) ends the job with
  /// one line and status 3 (--comm-timeout on the MPI transport).
  void set_wait_timeout(double seconds) const;

  const Collectives& collectives() const { return *this; }
  /// Broadcasts a string from process `root` to all.
  std::string broadcast(const std::string& text, int root) const;
  /// Collective: whether every process passed the same text.
  bool same_everywhere(const std::string& text) const;
  /// Collective agreement on failure: the error of the lowest process that has one, or "".
  std::string agree(const std::string& local_error) const;
  /// Every process's bytes, in rank order (e.g. device UUIDs, IPC handles).
  std::vector<std::string> allgather(const std::string& bytes) const;
  /// recv[p] = what process p passed as send[me]; both spans hold size() values.
  void alltoall(std::span<const std::uint64_t> send, std::span<std::uint64_t> recv) const;

  /// The implementation's communicator state (used by src/comm/ only).
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

/// The MPI transport (design §4, `--transport mpi`): host buffers, nonblocking point-to-point
/// between the processes hosting the logical ranks; messages between ranks of one process
/// never touch MPI.
std::unique_ptr<Transport> make_mpi_transport(const CommContext& comm);

}  // namespace cpd
