#include "cpdrift/util/sha256.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>

#ifdef CPD_SHA256_HAVE_SHANI
#include <immintrin.h>
#endif

namespace cpd {
namespace {

constexpr std::uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

constexpr std::array<std::uint32_t, 8> kInitial = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

std::uint32_t load_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

void compress(std::uint32_t state[8], const std::uint8_t* blocks, std::size_t count) {
#ifdef CPD_SHA256_HAVE_SHANI
  detail::sha256_blocks_shani(state, blocks, count);
#else
  detail::sha256_blocks_portable(state, blocks, count);
#endif
}

}  // namespace

namespace detail {

void sha256_blocks_portable(std::uint32_t state[8], const std::uint8_t* blocks, std::size_t count) {
  using std::rotr;
  for (; count > 0; --count, blocks += 64) {
    std::uint32_t w[64];
    for (int t = 0; t < 16; ++t) w[t] = load_be32(blocks + 4 * t);
    for (int t = 16; t < 64; ++t) {
      const std::uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const std::uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    std::uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    std::uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int t = 0; t < 64; ++t) {
      const std::uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const std::uint32_t ch = (e & f) ^ (~e & g);
      const std::uint32_t t1 = h + s1 + ch + kRound[t] + w[t];
      const std::uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const std::uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + s0 + maj;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
  }
}

#ifdef CPD_SHA256_HAVE_SHANI
// Intel's SHA extensions keep the state as the lane pairs ABEF / CDGH, and each
// sha256rnds2 performs two rounds, so four message words take two calls.
void sha256_blocks_shani(std::uint32_t state[8], const std::uint8_t* blocks, std::size_t count) {
  const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  __m128i dcba = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));
  __m128i hgfe = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));
  const __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
  const __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);

  for (; count > 0; --count, blocks += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i m[4];
    for (int i = 0; i < 4; ++i) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + 16 * i));
      m[i] = _mm_shuffle_epi8(raw, byteswap);
    }
    // Slot s holds the words of groups s, s+4, s+8, s+12 in turn. Group g does rounds
    // 4g..4g+3 with slot g and extends the schedule: msg2 completes group g+1 (slot g+1, which
    // msg1 prepared three groups ago) from groups g and g-1, and only then may msg1 overwrite
    // slot g-1 to start group g+3.
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      const __m128i k = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kRound + 4 * g));
      __m128i wk = _mm_add_epi32(m[g & 3], k);
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
      if (g >= 3 && g <= 14) {
        __m128i& next = m[(g + 1) & 3];
        next = _mm_add_epi32(next, _mm_alignr_epi8(m[g & 3], m[(g - 1) & 3], 4));
        next = _mm_sha256msg2_epu32(next, m[g & 3]);
      }
      wk = _mm_shuffle_epi32(wk, 0x0E);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, wk);
      if (g >= 1 && g <= 12) m[(g - 1) & 3] = _mm_sha256msg1_epu32(m[(g - 1) & 3], m[g & 3]);
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }

  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  dcba = _mm_blend_epi16(feba, dchg, 0xF0);
  hgfe = _mm_alignr_epi8(dchg, feba, 8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state), dcba);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), hgfe);
}
#endif

}  // namespace detail

Sha256::Sha256() : state_(kInitial) {}

void Sha256::update(const void* data, std::size_t bytes) {
  if (finished_) throw std::logic_error("Sha256::update called after finish()");
  if (bytes == 0) return;  // `data` may then be null, which memcpy does not allow
  auto in = static_cast<const std::uint8_t*>(data);
  total_bytes_ += bytes;
  if (buffered_ > 0) {
    const std::size_t take = std::min(bytes, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, in, take);
    buffered_ += take;
    in += take;
    bytes -= take;
    if (buffered_ < buffer_.size()) return;
    compress(state_.data(), buffer_.data(), 1);
    buffered_ = 0;
  }
  // Whole blocks are hashed in place: large inputs never pass through the buffer.
  const std::size_t whole = bytes / 64;
  if (whole > 0) compress(state_.data(), in, whole);
  in += whole * 64;
  bytes -= whole * 64;
  if (bytes > 0) std::memcpy(buffer_.data(), in, bytes);
  buffered_ = bytes;
}

Sha256::Digest Sha256::finish() {
  if (finished_) throw std::logic_error("Sha256::finish called twice");
  const std::uint64_t bit_length = total_bytes_ * 8;
  // One 0x80 byte, zeros up to 56 mod 64, then the 64-bit big-endian message length.
  std::uint8_t tail[128] = {0x80};
  const std::size_t pad = (buffered_ < 56 ? 56 : 120) - buffered_;
  for (std::size_t i = 0; i < 8; ++i)
    tail[pad + i] = static_cast<std::uint8_t>(bit_length >> (56 - 8 * i));
  update(tail, pad + 8);
  finished_ = true;

  Digest digest;
  for (std::size_t i = 0; i < 8; ++i) {
    for (std::size_t j = 0; j < 4; ++j) {
      digest[4 * i + j] = static_cast<std::uint8_t>(state_[i] >> (24 - 8 * j));
    }
  }
  return digest;
}

std::string Sha256::hex(const Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * digest.size());
  for (const std::uint8_t byte : digest) {
    out.push_back(kDigits[byte >> 4]);
    out.push_back(kDigits[byte & 0xF]);
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 hasher;
  hasher.update(bytes.data(), bytes.size());
  return Sha256::hex(hasher.finish());
}

}  // namespace cpd
