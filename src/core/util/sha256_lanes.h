// SHA-256 of several messages at once on one thread: the digests of the tensors rank 0 holds
// whole (metrics/digest.cpp).
//
// With the CPU's SHA instructions one message's compression is one dependent chain: each
// SHA256RNDS2 waits for the one before, so a single message leaves the unit idle most of the
// time (nettle: 1.4 GB/s on one of this machine's cores). Up to four messages' chains
// interleaved keep it busy: about 3 GB/s for four (docs/performance.md). Each message's digest
// is its own SHA-256, the same as Sha256 gives; on a CPU without the SHA extensions every
// message goes through Sha256 (nettle), one after another.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <vector>

#include "core/util/sha256.h"

namespace cpd {

/// A message's bytes, span after span, in order; an empty span ends it. A span stays readable
/// until the next call.
using ByteSpans = std::function<std::span<const std::uint8_t>()>;

/// One message's outcome: its digest, or what its ByteSpans threw (the others go on).
struct LaneDigest {
  Sha256::Digest digest{};
  std::exception_ptr error;
};

enum class ShaPath {
  best,    // the SHA instructions, four messages at once, where the CPU has them
  nettle,  // Sha256, one message after another
};

/// The SHA-256 of each message, in order, on the calling thread. Each message's spans are read
/// as its lane needs them, so at most four messages are being read at any time.
std::vector<LaneDigest> sha256_lanes(std::span<ByteSpans> messages, ShaPath path = ShaPath::best);

/// Whether this CPU has the SHA extensions that ShaPath::best interleaves.
bool sha_instructions_available();

}  // namespace cpd
