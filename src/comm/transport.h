// The seam between the per-rank protocol code and how bytes move (design §4).
//
// Protocols run in supersteps: every logical rank hosted by a process produces its outgoing
// messages, the transport delivers them, and the next superstep starts from what arrived.
// The per-rank code is the same whether a message is a local move or crosses processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/message.h"

namespace cpd {

/// Bytes and messages a transport moved, for the report and the benchmarks.
struct TransportCounters {
  std::uint64_t messages = 0;
  std::uint64_t bytes = 0;         // header + payload bytes of every delivered message
  std::uint64_t remote_bytes = 0;  // of which crossed between processes

  /// What moved between two readings (`later` - `earlier`).
  friend TransportCounters operator-(const TransportCounters& later,
                                     const TransportCounters& earlier) {
    return {later.messages - earlier.messages, later.bytes - earlier.bytes,
            later.remote_bytes - earlier.remote_bytes};
  }
};

/// Counts `outgoing` in `counters` and cuts it by destination process (logical rank ℓ lives on
/// process ℓ mod world): element p holds process p's messages in send order ([me]: this
/// process's own).
std::vector<std::vector<Message>> route_messages(std::vector<Message> outgoing, int world, int me,
                                                 TransportCounters& counters);

class Transport {
 public:
  virtual ~Transport() = default;
  /// The report's name for it: "inprocess", "mpi", "nccl" or "cuda_ipc".
  virtual const char* name() const = 0;
  /// Number of processes the logical ranks are spread over, and this one's index.
  virtual int world_size() const = 0;
  virtual int process_index() const = 0;

  /// Starts one superstep. Collective: every process calls it once, passing the messages
  /// sent by the logical ranks it hosts; they are in flight until finish(), so the caller
  /// can compute meanwhile. One superstep at a time.
  virtual void start(std::vector<Message> outgoing) = 0;
  /// Completes the superstep: the messages addressed to logical ranks this process hosts,
  /// in no particular order (receivers sort by what the header says, never by arrival).
  virtual std::vector<Message> finish() = 0;

  /// Collective agreement on failure: every process passes the error it saw ("" for none);
  /// all of them return the error of the lowest process that saw one, or "" when none did.
  /// Protocols call it after every validation, so a bad message fails every rank alike.
  virtual std::string agree(const std::string& local_error) = 0;

  const TransportCounters& counters() const { return counters_; }

 protected:
  TransportCounters counters_;
};

/// W = 1: every logical rank lives in this process and a send is a move. `shuffle_seed`
/// ≠ 0 delivers in a pseudo-random order, which tests use to show arrival order never
/// reaches a result.
class InProcessTransport final : public Transport {
 public:
  explicit InProcessTransport(std::uint64_t shuffle_seed = 0) : shuffle_seed_(shuffle_seed) {}
  const char* name() const override { return "inprocess"; }
  int world_size() const override { return 1; }
  int process_index() const override { return 0; }
  void start(std::vector<Message> outgoing) override;
  std::vector<Message> finish() override;
  std::string agree(const std::string& local_error) override { return local_error; }

 private:
  std::uint64_t shuffle_seed_;
  std::uint64_t step_ = 0;
  std::vector<Message> in_flight_;
};

}  // namespace cpd
