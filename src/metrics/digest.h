// SHA-256 digests of distributed tensors in global order (design §5): two runs, two
// topologies or two machines compare by digest alone.
#pragma once

#include <span>
#include <string>

#include "comm/global_tensor.h"

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

/// The same digest of `values`, a whole tensor in global order held in one array.
std::string values_digest(std::span<const float> values, DigestFormat format);

}  // namespace cpd
