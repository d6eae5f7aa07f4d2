// PyTorch's scaled_dot_product_attention, timed in a python3 subprocess, as the yardstick for
// `cpdrift bench --device cuda`.
#pragma once

#include <optional>
#include <string>

#include "core/model.h"

namespace cpd {

struct TorchSdpaFigure {
  std::string backend;  // the fastest SDPA backend, e.g. "FLASH_ATTENTION"
  double seconds = 0;   // its median causal forward time on the problem's shape
  std::string torch_version;
};

/// Times every SDPA backend torch offers on BF16 inputs of the problem's shape (causal, GQA by
/// repeating K and V) on CUDA device `device`, and returns the fastest; nullopt with `why` set
/// when python3, torch or a CUDA device is missing.
std::optional<TorchSdpaFigure> time_torch_sdpa(const Problem& problem, int repeats, int device,
                                               std::string& why);

}  // namespace cpd
