// The models cpdrift knows by name (`--model NAME`, docs/models.md): each entry is a real
// model's attention as its Hugging Face config.json gives it, pinned to the repository and
// revision it was read at. Any other model of these families runs from its own config.json
// (`--model-config`, inputs/model_config.h).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/model.h"

namespace cpd {

/// The largest head dim the program takes (the CPU attention tiles take a multiple of 64; the
/// CUDA tensor-core kernel 128 only, and it says so).
inline constexpr int kMaxHeadDim = 256;

/// The table, in the order docs/models.md lists it; the first entry is the default (ModelDims{}).
const std::vector<ModelDims>& known_models();

/// The entry named `name`, or null.
const ModelDims* find_model(std::string_view name);

/// "qwen3-4b, qwen3-8b, …": the names, for a refusal or --help.
std::string known_model_names();

/// Why the program cannot run `dims` (heads that do not group, a head dim the kernels do not
/// take, …), or "" when it can.
std::string model_problem(const ModelDims& dims);

}  // namespace cpd
