#include "comm/transport.h"

#include <algorithm>
#include <random>
#include <string>

#include "core/plan.h"
#include "cpdrift/enum_names.h"

namespace cpd {
namespace {

constexpr EnumName<MessageKind> kMessageKinds[] = {
    {MessageKind::q_shard, "q_shard"},
    {MessageKind::kv_shard, "kv_shard"},
    {MessageKind::partial_state, "partial_state"},
    {MessageKind::backward_rows, "backward_rows"},
    {MessageKind::dq_partial, "dq_partial"},
    {MessageKind::logit_partial, "logit_partial"},
    {MessageKind::reference_grads, "reference_grads"},
    {MessageKind::reference_forward, "reference_forward"},
    {MessageKind::layer_partial, "layer_partial"},
    {MessageKind::layer_rows, "layer_rows"},
    {MessageKind::vocab_logits, "vocab_logits"},
    {MessageKind::token_partial, "token_partial"},
};

}  // namespace

const char* to_string(MessageKind k) { return name_of(kMessageKinds, k); }

std::string describe(const MessageHeader& h) {
  std::string s = to_string(h.kind);
  if (h.block_index >= 0) {
    s += " of KV block " + std::to_string(h.block_index) + " [" + std::to_string(h.block_begin) +
         "," + std::to_string(h.block_end) + ")";
  }
  s += " for tokens [" + std::to_string(h.token_begin) + "," + std::to_string(h.token_end) +
       ") heads [" + std::to_string(h.head_begin) + "," + std::to_string(h.head_end) +
       ") from logical rank " + std::to_string(h.src) + " to " + std::to_string(h.dst);
  return s;
}

std::vector<std::vector<Message>> route_messages(std::vector<Message> outgoing, int world, int me,
                                                 TransportCounters& counters) {
  std::vector<std::vector<Message>> routed(static_cast<std::size_t>(world));
  for (Message& m : outgoing) {
    const std::uint64_t bytes = sizeof(MessageHeader) + m.payload.size() * sizeof(float);
    const int process = process_of(m.header.dst, world);
    ++counters.messages;
    counters.bytes += bytes;
    if (process != me) counters.remote_bytes += bytes;
    routed[static_cast<std::size_t>(process)].push_back(std::move(m));
  }
  return routed;
}

void InProcessTransport::start(std::vector<Message> outgoing) {
  outgoing = std::move(route_messages(std::move(outgoing), 1, 0, counters_)[0]);
  if (shuffle_seed_ != 0) {
    std::mt19937_64 rng(shuffle_seed_ + step_++);
    std::shuffle(outgoing.begin(), outgoing.end(), rng);
  }
  in_flight_ = std::move(outgoing);
}

std::vector<Message> InProcessTransport::finish() { return std::move(in_flight_); }

}  // namespace cpd
