#include "core/util/sha256.h"

#include <nettle/base16.h>
#include <nettle/sha2.h>
#include <nettle/version.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>

#include "core/errors.h"

namespace cpd {

static_assert(SHA256_DIGEST_SIZE == std::tuple_size_v<Sha256::Digest>);

Sha256::Sha256() {
  static_assert(sizeof(sha256_ctx) <= kContextBytes, "nettle's sha256_ctx outgrew Sha256");
  static_assert(alignof(sha256_ctx) <= kContextAlign);
  sha256_init(::new (context_.data()) sha256_ctx);
}

sha256_ctx* Sha256::context() {
  return std::launder(reinterpret_cast<sha256_ctx*>(context_.data()));
}

void Sha256::update(const void* data, std::size_t bytes) {
  if (finished_) throw std::logic_error("Sha256::update called after finish()");
  if (bytes == 0) return;  // `data` may then be null
  sha256_update(context(), bytes, static_cast<const std::uint8_t*>(data));
}

Sha256::Digest Sha256::finish() {
  if (finished_) throw std::logic_error("Sha256::finish called twice");
  finished_ = true;
  Digest digest;
#if NETTLE_VERSION_MAJOR >= 4
  sha256_digest(context(), digest.data());  // nettle 4 always writes the whole digest
#else
  sha256_digest(context(), digest.size(), digest.data());
#endif
  return digest;
}

std::string Sha256::hex(const Digest& digest) {
  std::string out(BASE16_ENCODE_LENGTH(digest.size()), '\0');
  base16_encode_update(out.data(), digest.size(), digest.data());  // lowercase digits
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 hasher;
  hasher.update(bytes.data(), bytes.size());
  return Sha256::hex(hasher.finish());
}

FileDigest sha256_files(const std::vector<std::string>& paths) {
  FileDigest out;
  Sha256 sha;
  std::vector<char> buf(1 << 20);
  for (const std::string& path : paths) {
    const std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"),
                                                            std::fclose);
    if (!f) throw UsageError(path + ": cannot read: " + std::strerror(errno));
    for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0;) {
      sha.update(buf.data(), n);
      out.size_bytes += n;
    }
    if (std::ferror(f.get()) != 0) throw UsageError(path + ": read error: " + std::strerror(errno));
  }
  out.sha256 = Sha256::hex(sha.finish());
  return out;
}

}  // namespace cpd
