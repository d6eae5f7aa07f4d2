// SHA-256 digests of distributed tensors in global order (design §5): two runs, two
// topologies or two machines compare by digest alone.
#pragma once

#include <atomic>
#include <cstddef>
#include <future>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/global_tensor.h"
#include "core/util/sha256_lanes.h"

namespace cpd {

enum class DigestFormat {
  fp32,  // 4 little-endian bytes per element
  bf16,  // the 2-byte BF16 pattern (the values must be BF16-exact: a BF16 final write)
};

/// Streams the tensor to rank 0 (collective) and returns its SHA-256 in `format` there
/// ("" elsewhere). `also` sees every piece on rank 0 too (the dump writer), when set.
std::string stream_digest(const Collectives& coll, const GlobalTensor& tensor, DigestFormat format,
                          const PieceSink& also = {});

/// Whether rank 0 holds every segment of the tensor (always so in one process). Every process
/// gives the same answer: the segments' owners are part of the shared piece list.
bool held_by_root(const GlobalTensor& tensor);

/// The digest stream_digest gives, of a tensor held_by_root, on rank 0 alone: no collective,
/// so several can run at once on different threads.
std::string local_digest(const GlobalTensor& tensor, DigestFormat format);

/// A tensor held_by_root to hash on rank 0 alone: its index among the published ones (for
/// PublishedDigests), its layout (which must outlive the hashing) and its format.
struct LocalDigestJob {
  std::size_t index = 0;
  const GlobalTensor* tensor = nullptr;
  DigestFormat format = DigestFormat::fp32;
};

/// local_digest of each job, hashed together on the calling thread (sha256_lanes: up to four
/// at once); a tensor that cannot be hashed carries its error, and the others their digests.
std::vector<LaneDigest> local_digests(std::span<const LocalDigestJob> jobs);

/// The digests of a step's published tensors as they become known, for the statistics that
/// carry them. Those streamed to rank 0 are set at once; those rank 0 holds whole are hashed on
/// a thread of their own, a group of up to four tensors of one size at a time (local_digests),
/// while the statistics run on the pool: SHA-256 is sequential within a tensor, so hashing them
/// on the pool first left a core idle behind the largest (docs/performance.md). at(i) waits for
/// tensor i's digest, and while it waits it hashes the groups that thread has not started, so
/// that no core idles behind the thread. set, hash_rest and at are called from one thread, the
/// one that publishes and measures.
class PublishedDigests {
 public:
  /// `n` tensors, none known yet. Destroying it waits for the hashing thread, if any.
  explicit PublishedDigests(std::size_t n);
  PublishedDigests(const PublishedDigests&) = delete;
  PublishedDigests& operator=(const PublishedDigests&) = delete;

  /// Tensor i's digest, known now ("" where none is taken or off rank 0). Before hash_rest.
  void set(std::size_t i, std::string digest);

  /// The rest, once: the jobs' tensors hashed on a thread of their own, in groups taken in the
  /// order of their first jobs (by at() too, while it waits); every other tensor not set reads
  /// "". at() waits until this has been called.
  void hash_rest(std::vector<LocalDigestJob> jobs);

  /// Tensor i's digest, once known; rethrows what its hashing threw. Until it is known, the
  /// caller hashes the jobs that no thread has taken yet.
  const std::string& at(std::size_t i) const;

 private:
  /// Hashes the next group no one has taken, if any; false when none is left.
  bool hash_next() const;

  // at() is logically const: it only brings forward work that hash_rest already gave.
  mutable std::vector<std::promise<std::string>> promises_;
  std::vector<std::shared_future<std::string>> digests_;
  std::vector<bool> settled_;  // set, or given to hash_rest
  bool rest_given_ = false;
  std::vector<LocalDigestJob> jobs_;                         // each group's jobs next to each other
  std::vector<std::pair<std::size_t, std::size_t>> groups_;  // first job, count
  mutable std::atomic<std::size_t> next_group_{0};           // the first group not taken yet
  std::jthread hashing_;  // last: joined before the promises and the jobs go
};

}  // namespace cpd
