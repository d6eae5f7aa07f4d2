// SHA-256 (FIPS 180-4) for fingerprinting inputs, configurations and reports.
//
// Self-contained so hashing never depends on which crypto library a cluster happens to ship.
// The portable path is always compiled; when the compiler targets SHA-NI (`-msha`, or a
// `-march` that implies it) the block function uses those instructions instead.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#if defined(__SHA__) && defined(__SSE4_1__) && (defined(__x86_64__) || defined(__i386__))
#define CPD_SHA256_HAVE_SHANI 1
#endif

namespace cpd {

class Sha256 {
 public:
  using Digest = std::array<std::uint8_t, 32>;

  Sha256();

  /// Feeds more bytes; the digest does not depend on how the input is split across calls.
  /// Throws std::logic_error after finish().
  void update(const void* data, std::size_t bytes);

  /// Pads, returns the digest and leaves the object spent: a second finish() or a later
  /// update() throws std::logic_error (construct a new Sha256 to hash again).
  Digest finish();

  /// Lowercase hexadecimal, 64 characters.
  static std::string hex(const Digest& digest);

 private:
  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

/// Lowercase hex SHA-256 of `bytes`.
std::string sha256_hex(std::string_view bytes);

namespace detail {

/// Runs the compression function over `count` consecutive 64-byte blocks. Exposed so tests can
/// check that every implementation agrees.
void sha256_blocks_portable(std::uint32_t state[8], const std::uint8_t* blocks, std::size_t count);
#ifdef CPD_SHA256_HAVE_SHANI
void sha256_blocks_shani(std::uint32_t state[8], const std::uint8_t* blocks, std::size_t count);
#endif

}  // namespace detail
}  // namespace cpd
