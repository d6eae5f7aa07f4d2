// The machine `cpdrift plan` estimates a run on: a device's figures (the h200 defaults or the
// user's), or this machine's CPU kernels and memcpy, measured now.
#pragma once

#include <string>

#include "cli/options.h"

namespace cpd {

/// Link figures are per direction and per GPU (process).
struct Profile {
  std::string name;
  double bf16_flops = 0, fp32_flops = 0, fp32_backward_flops = 0;  // FLOP/s of one process
  double hbm = 0, nvlink = 0, network = 0;                         // bytes/s
  int processes_per_node = 8;
  std::string source;  // where the figures come from
};

/// The CPU profile: this machine's forward and backward kernels and its memcpy, measured now
/// over every core, shared evenly by `processes` processes on the node.
Profile measure_cpu(int processes);

/// The device profile the plan options describe.
Profile device_profile(const PlanOptions& o);

}  // namespace cpd
