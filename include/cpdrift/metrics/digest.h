// How tensors enter SHA-256 digests (design §5): two runs, two topologies or two machines
// compare by digest alone. The streaming itself is engine/tensor_stream.h.
#pragma once

namespace cpd {

enum class DigestFormat {
  fp32,  // 4 little-endian bytes per element
  bf16,  // the 2-byte BF16 pattern (the values must be BF16-exact: a BF16 final write)
};

}  // namespace cpd
