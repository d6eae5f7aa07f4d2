// `--inputs PATH` (docs/inputs.md): a model's own attention inputs, read instead of generated.
//   HDF5          datasets q [B, Hq, S, D], k and v [B, Hkv, S, D] at / or under /inputs (a
//                 cpdrift dump's --dump-inputs), float32, float16, or uint16 holding bfloat16
//                 bits with attribute dtype = "bfloat16"; attribute rope_applied (0/1) on q and
//                 k; optional positions [B, S]
//   safetensors   tensors "q", "k", "v" (F32, F16 or BF16) and optional "positions" (I32/I64);
//                 __metadata__ {"rope_applied": "true"|"false"}
//   .npy          a directory: q.npy, k.npy, v.npy (float32 or float16), optional
//                 positions.npy, and inputs.json {"rope_applied": true|false}
// Under --scope layer the file holds the layer's hidden states instead of q, k, v: hidden
// [B, S, hidden] (HDF5 dataset, safetensors tensor "hidden", hidden.npy; inputs.json optional),
// with optional positions as above; no rope_applied (the layer applies RoPE).
// Each process reads only the rows it owns (HDF5 hyperslabs, offsets into the raw files).
#pragma once

#include <memory>
#include <string>

#include "core/input_source.h"
#include "core/model.h"

namespace cpd {

/// Opens and checks `path` against `dims` (head counts, head dim; with `layer`, the hidden size):
/// every mismatch, a missing tensor or attribute, an unknown dtype or a truncated file is a
/// UsageError naming the file and what is wrong. With `fingerprint`, hashes the file(s)
/// (SHA-256) for the report.
std::shared_ptr<const InputSource> open_input_file(const std::string& path, const ModelDims& dims,
                                                   bool layer, bool fingerprint);

}  // namespace cpd
