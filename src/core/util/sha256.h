// SHA-256 (FIPS 180-4) for fingerprinting inputs, configurations and reports.
//
// Computed by nettle (libnettle, Debian's nettle-dev), a maintained implementation that uses
// the CPU's SHA instructions where it finds them; this class adapts it to cpdrift's streaming
// use. Host only: digests are taken of host memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

struct sha256_ctx;  // nettle's state, kept out of this header (sha256.cpp)

namespace cpd {

class Sha256 {
 public:
  using Digest = std::array<std::uint8_t, 32>;

  Sha256();

  /// Feeds more bytes; the digest does not depend on how the input is split across calls.
  /// `data` may be null when `bytes` is 0. Throws std::logic_error after finish().
  void update(const void* data, std::size_t bytes);

  /// Pads, returns the digest and leaves the object spent: a second finish() or a later
  /// update() throws std::logic_error (construct a new Sha256 to hash again).
  Digest finish();

  /// Lowercase hexadecimal, 64 characters.
  static std::string hex(const Digest& digest);

 private:
  sha256_ctx* context();

  // Storage for nettle's sha256_ctx (a plain C struct of 112 bytes on 64-bit targets; the
  // constructor checks that it fits), so that including this header needs no nettle headers.
  static constexpr std::size_t kContextBytes = 128;
  static constexpr std::size_t kContextAlign = 8;
  alignas(kContextAlign) std::array<std::byte, kContextBytes> context_{};
  bool finished_ = false;
};

/// Lowercase hex SHA-256 of `bytes`.
std::string sha256_hex(std::string_view bytes);

/// What identifies input files in a report: their bytes' SHA-256 and their size.
struct FileDigest {
  std::string sha256;  ///< lowercase hex
  std::uint64_t size_bytes = 0;
};

/// The SHA-256 of the files' bytes, one after the other, read in 1 MiB pieces (nothing held
/// whole), and their total size. Throws cpd::UsageError naming the path that cannot be read.
FileDigest sha256_files(const std::vector<std::string>& paths);

}  // namespace cpd
