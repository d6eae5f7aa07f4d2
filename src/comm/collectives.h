// What the processes of a run do together besides protocol messages: exact counter
// reductions for the statistics, and streaming a distributed tensor to rank 0 in global
// order (for digests and dumps) without ever holding more than one piece there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace cpd {

/// Combines counters element-wise across everything that holds parts of the same tensors
/// (the processes of an MPI job). The default is the identity: one holder.
class CounterReducer {
 public:
  virtual ~CounterReducer() = default;
  virtual void sum(std::span<std::uint64_t>) const {}
  virtual void max(std::span<std::uint64_t>) const {}
};

/// One contiguous piece of a distributed tensor, in the order the stream visits it.
struct StreamSegment {
  int owner = 0;                // process holding it
  const float* data = nullptr;  // valid on the owner only
  std::size_t floats = 0;
};

class Collectives : public CounterReducer {
 public:
  virtual int rank() const = 0;
  virtual int size() const = 0;
  bool root() const { return rank() == 0; }

  /// Collective: every process passes the same segment list. Rank 0's `sink` receives each
  /// segment's data in list order (other processes' sinks are never called); a segment's
  /// data pointer lives only as long as the call to sink.
  virtual void stream_to_root(
      std::span<const StreamSegment> segments,
      const std::function<void(std::size_t index, const float* data)>& sink) const = 0;
};

/// One process: reductions are the identity and every segment is local.
class LocalCollectives final : public Collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void stream_to_root(std::span<const StreamSegment> segments,
                      const std::function<void(std::size_t, const float*)>& sink) const override {
    for (std::size_t i = 0; i < segments.size(); ++i) sink(i, segments[i].data);
  }
};

}  // namespace cpd
