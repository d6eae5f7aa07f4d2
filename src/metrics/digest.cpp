#include "cpdrift/metrics/digest.h"

#include <cstdint>
#include <vector>

#include "cpdrift/numerics/bf16.h"
#include "cpdrift/util/sha256.h"

namespace cpd {

std::string stream_digest(const Collectives& coll, const GlobalTensor& tensor, DigestFormat format,
                          const PieceSink& also) {
  Sha256 sha;
  std::vector<std::uint16_t> staging;
  coll.stream_to_root(tensor.segments, [&](std::size_t i, const float* rows) {
    const std::size_t n = tensor.segments[i].floats;
    if (format == DigestFormat::fp32) {
      sha.update(rows, n * sizeof(float));
    } else {
      staging.resize(n);
      for (std::size_t j = 0; j < n; ++j) staging[j] = bf16_bits_rn(rows[j]);
      sha.update(staging.data(), n * sizeof(std::uint16_t));
    }
    if (also) also(tensor.pieces[i], rows);
  });
  return coll.root() ? Sha256::hex(sha.finish()) : std::string();
}

}  // namespace cpd
