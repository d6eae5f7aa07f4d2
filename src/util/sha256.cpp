#include "cpdrift/util/sha256.h"

#include <nettle/base16.h>
#include <nettle/sha2.h>
#include <nettle/version.h>

#include <new>
#include <stdexcept>

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

}  // namespace cpd
