// Test support: a transport that tampers with messages of one kind before delivering them
// through another transport, to show the manifest catches every kind of bad message.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "comm/transport.h"

namespace cpd::testing {

class FaultInjectingTransport final : public Transport {
 public:
  using Fault = std::function<void(std::vector<Message>&)>;
  /// `fault` sees this process's outgoing messages of `kind` (when any) before they leave.
  FaultInjectingTransport(Transport& inner, MessageKind kind, Fault fault)
      : inner_(inner), kind_(kind), fault_(std::move(fault)) {}
  const char* name() const override { return inner_.name(); }
  int world_size() const override { return inner_.world_size(); }
  int process_index() const override { return inner_.process_index(); }
  void start(std::vector<Message> outgoing) override {
    if (!outgoing.empty() && outgoing.front().header.kind == kind_) fault_(outgoing);
    inner_.start(std::move(outgoing));
  }
  std::vector<Message> finish() override { return inner_.finish(); }
  std::string agree(const std::string& local_error) override { return inner_.agree(local_error); }

 private:
  Transport& inner_;
  MessageKind kind_;
  Fault fault_;
};

}  // namespace cpd::testing
