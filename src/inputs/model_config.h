// A model's own Hugging Face config.json (`--model-config`, docs/models.md): the attention's
// fields read as transformers reads them, and where a property is not a field, decided by the
// `model_type` as the reference implementation decides it.
#pragma once

#include <string>
#include <string_view>

#include "core/model.h"

namespace cpd {

/// The model `text` describes; `path` names it in refusals and in the description's source. A
/// file cpdrift cannot run (not JSON, a missing field, an unknown model_type, an unsupported
/// rope scaling, heads that do not group) is a UsageError in one line naming the field.
ModelDims parse_model_config(std::string_view text, const std::string& path);

/// Reads and parses the file at `path`; the source records its SHA-256.
ModelDims read_model_config(const std::string& path);

}  // namespace cpd
