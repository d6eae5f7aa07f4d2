#include "core/util/sha256_lanes.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define CPDRIFT_SHA_INSTRUCTIONS 1
#else
#define CPDRIFT_SHA_INSTRUCTIONS 0
#endif

namespace cpd {
namespace {

#if CPDRIFT_SHA_INSTRUCTIONS

constexpr std::size_t kBlockBytes = 64;
constexpr std::size_t kMaxLanes = 4;
using State = std::array<std::uint32_t, 8>;  // a..h, as FIPS 180-4 numbers them

constexpr State kInitial = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                            0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

alignas(16) constexpr std::uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// `blocks` 64-byte blocks of each of L messages into their states. SHA256RNDS2 keeps the state
// as two vectors, (a, b, e, f) and (c, d, g, h); each group of four rounds takes four words of
// the message schedule, the first sixteen the block's own (big-endian) and the rest made by
// SHA256MSG1 and SHA256MSG2 from the four groups before. The lanes' rounds are interleaved,
// each lane's arithmetic the standard's own.
template <std::size_t L>
__attribute__((target("sha,sse4.1,ssse3"))) void compress(State* const* state,
                                                          const std::uint8_t* const* data,
                                                          std::size_t blocks) {
  const __m128i big_endian = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  __m128i abef[L], cdgh[L];
  const std::uint8_t* at[L];
#pragma GCC unroll 4
  for (std::size_t l = 0; l < L; ++l) {
    const __m128i dcba = _mm_shuffle_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(state[l]->data())), 0xB1);
    const __m128i efgh = _mm_shuffle_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(state[l]->data() + 4)), 0x1B);
    abef[l] = _mm_alignr_epi8(dcba, efgh, 8);
    cdgh[l] = _mm_blend_epi16(efgh, dcba, 0xF0);
    at[l] = data[l];
  }
  for (std::size_t b = 0; b < blocks; ++b) {
    __m128i start_abef[L], start_cdgh[L], w[L][4];
#pragma GCC unroll 4
    for (std::size_t l = 0; l < L; ++l) {
      start_abef[l] = abef[l];
      start_cdgh[l] = cdgh[l];
    }
#pragma GCC unroll 16
    for (std::size_t j = 0; j < 16; ++j) {
      const __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(kRound + 4 * j));
#pragma GCC unroll 4
      for (std::size_t l = 0; l < L; ++l) {
        __m128i words;
        if (j < 4) {
          words = _mm_shuffle_epi8(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(at[l] + 16 * j)), big_endian);
        } else {
          words = _mm_sha256msg1_epu32(w[l][j % 4], w[l][(j + 1) % 4]);
          words = _mm_add_epi32(words, _mm_alignr_epi8(w[l][(j + 3) % 4], w[l][(j + 2) % 4], 4));
          words = _mm_sha256msg2_epu32(words, w[l][(j + 3) % 4]);
        }
        w[l][j % 4] = words;
        const __m128i sum = _mm_add_epi32(words, k);
        cdgh[l] = _mm_sha256rnds2_epu32(cdgh[l], abef[l], sum);
        abef[l] = _mm_sha256rnds2_epu32(abef[l], cdgh[l], _mm_shuffle_epi32(sum, 0x0E));
      }
    }
#pragma GCC unroll 4
    for (std::size_t l = 0; l < L; ++l) {
      abef[l] = _mm_add_epi32(abef[l], start_abef[l]);
      cdgh[l] = _mm_add_epi32(cdgh[l], start_cdgh[l]);
      at[l] += kBlockBytes;
    }
  }
#pragma GCC unroll 4
  for (std::size_t l = 0; l < L; ++l) {
    const __m128i feba = _mm_shuffle_epi32(abef[l], 0x1B);
    const __m128i dchg = _mm_shuffle_epi32(cdgh[l], 0xB1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(state[l]->data()),
                     _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(state[l]->data() + 4),
                     _mm_alignr_epi8(dchg, feba, 8));
  }
}

void compress_lanes(std::size_t lanes, State* const* state, const std::uint8_t* const* data,
                    std::size_t blocks) {
  switch (lanes) {
    case 1:
      return compress<1>(state, data, blocks);
    case 2:
      return compress<2>(state, data, blocks);
    case 3:
      return compress<3>(state, data, blocks);
    default:
      return compress<4>(state, data, blocks);
  }
}

// One message being hashed: its state, how many bytes went in, the unread rest of its current
// span, and a block being gathered where a span ends within one.
struct Lane {
  std::size_t message = 0;
  State state = kInitial;
  std::uint64_t bytes = 0;
  std::span<const std::uint8_t> span;
  std::array<std::uint8_t, kBlockBytes> carry{};
  std::size_t carried = 0;

  // Brings whole blocks to hand: how many lie at `at` (1 when gathered in the carry), or 0 when
  // the message has ended, the last (fewer than 64) bytes in the carry.
  std::size_t blocks_at_hand(ByteSpans& source, const std::uint8_t*& at) {
    while (true) {
      if (carried == 0 && span.size() >= kBlockBytes) {
        at = span.data();
        return span.size() / kBlockBytes;
      }
      const std::size_t take = std::min(kBlockBytes - carried, span.size());
      if (take > 0) std::memcpy(carry.data() + carried, span.data(), take);
      carried += take;
      span = span.subspan(take);
      if (carried == kBlockBytes) {
        at = carry.data();
        return 1;
      }
      span = source();
      if (span.empty()) return 0;
    }
  }

  void consumed(const std::uint8_t* at, std::size_t blocks) {
    if (at == carry.data()) {
      carried = 0;
    } else {
      span = span.subspan(blocks * kBlockBytes);
    }
    bytes += blocks * kBlockBytes;
  }

  // The padding (0x80, zeros, the length in bits, big-endian) and the digest.
  Sha256::Digest finish() {
    std::array<std::uint8_t, 2 * kBlockBytes> tail{};
    std::memcpy(tail.data(), carry.data(), carried);
    tail[carried] = 0x80;
    const std::size_t blocks = carried + 1 + 8 <= kBlockBytes ? 1 : 2;
    const std::uint64_t bits = (bytes + carried) * 8;
    for (std::size_t i = 0; i < 8; ++i)
      tail[blocks * kBlockBytes - 1 - i] = static_cast<std::uint8_t>(bits >> (8 * i));
    State* s = &state;
    const std::uint8_t* d = tail.data();
    compress_lanes(1, &s, &d, blocks);
    Sha256::Digest digest;
    for (std::size_t i = 0; i < digest.size(); ++i)
      digest[i] = static_cast<std::uint8_t>(state[i / 4] >> (24 - 8 * (i % 4)));
    return digest;
  }
};

// The messages in lanes of up to four: each round, every lane brings whole blocks to hand (a lane
// whose message ended, or whose spans threw, leaves and the next message takes its place), and
// all lanes compress as many blocks as the shortest has.
void hash_in_lanes(std::span<ByteSpans> messages, std::vector<LaneDigest>& out) {
  std::vector<Lane> lanes;
  std::size_t next = 0;
  while (true) {
    while (lanes.size() < kMaxLanes && next < messages.size()) {
      lanes.emplace_back();
      lanes.back().message = next++;
    }
    if (lanes.empty()) return;
    std::array<const std::uint8_t*, kMaxLanes> at{};
    std::size_t blocks = std::numeric_limits<std::size_t>::max();
    for (std::size_t l = 0; l < lanes.size();) {
      Lane& lane = lanes[l];
      std::size_t here = 0;
      try {
        here = lane.blocks_at_hand(messages[lane.message], at[l]);
        if (here == 0) out[lane.message].digest = lane.finish();
      } catch (...) {
        out[lane.message].error = std::current_exception();
      }
      if (here == 0) {
        lanes.erase(lanes.begin() + static_cast<std::ptrdiff_t>(l));
        continue;
      }
      blocks = std::min(blocks, here);
      ++l;
    }
    if (lanes.empty()) continue;
    std::array<State*, kMaxLanes> states{};
    for (std::size_t l = 0; l < lanes.size(); ++l) states[l] = &lanes[l].state;
    compress_lanes(lanes.size(), states.data(), at.data(), blocks);
    for (std::size_t l = 0; l < lanes.size(); ++l) lanes[l].consumed(at[l], blocks);
  }
}

#endif  // CPDRIFT_SHA_INSTRUCTIONS

void hash_one_by_one(std::span<ByteSpans> messages, std::vector<LaneDigest>& out) {
  for (std::size_t i = 0; i < messages.size(); ++i) {
    try {
      Sha256 hasher;
      for (std::span<const std::uint8_t> s = messages[i](); !s.empty(); s = messages[i]())
        hasher.update(s.data(), s.size());
      out[i].digest = hasher.finish();
    } catch (...) {
      out[i].error = std::current_exception();
    }
  }
}

}  // namespace

bool sha_instructions_available() {
#if CPDRIFT_SHA_INSTRUCTIONS
  static const bool available = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
    const bool sse = (c & bit_SSSE3) != 0 && (c & bit_SSE4_1) != 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    return sse && (b & bit_SHA) != 0;
  }();
  return available;
#else
  return false;
#endif
}

std::vector<LaneDigest> sha256_lanes(std::span<ByteSpans> messages, ShaPath path) {
  std::vector<LaneDigest> out(messages.size());
  if (path == ShaPath::best && sha_instructions_available()) {
#if CPDRIFT_SHA_INSTRUCTIONS
    hash_in_lanes(messages, out);
    return out;
#endif
  }
  hash_one_by_one(messages, out);
  return out;
}

}  // namespace cpd
