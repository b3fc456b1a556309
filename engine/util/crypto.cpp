#include "util/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>

#include "util/error.hpp"

namespace tessera {

namespace {

[[noreturn]] void fail(const char *what) {
  throw Error(TSR_ERR_INTERNAL, std::string("OpenSSL: ") + what + " failed");
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    fail("SHA-256 init");
  }
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(ctx_);
}

void Sha256::update(const void *data, size_t n) {
  if (n > 0 && EVP_DigestUpdate(ctx_, data, n) != 1) fail("SHA-256 update");
}

Sha256Digest Sha256::finish() {
  Sha256Digest d{};
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_, d.data(), &len) != 1 || len != d.size()) fail("SHA-256 final");
  return d;
}

Sha256Digest sha256(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.finish();
}

Sha256Digest hmac_sha256(std::string_view key, std::string_view message) {
  if (key.size() > INT_MAX) throw Error(TSR_ERR_INVALID, "HMAC key too long");
  Sha256Digest d{};
  unsigned int len = 0;
  // A zero-length key still needs a valid pointer.
  static const char empty = 0;
  const void *k = key.empty() ? &empty : key.data();
  if (!HMAC(EVP_sha256(), k, static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char *>(message.data()), message.size(), d.data(),
            &len) ||
      len != d.size())
    fail("HMAC-SHA256");
  return d;
}

std::string to_hex(const void *data, size_t n) {
  static const char *digits = "0123456789abcdef";
  const auto *p = static_cast<const uint8_t *>(data);
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

bool equal_constant_time(std::string_view a, std::string_view b) {
  return a.size() == b.size() && (a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0);
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (n > INT_MAX) throw Error(TSR_ERR_INVALID, "random_bytes: too many");
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char *>(out.data()), static_cast<int>(n)) != 1)
    throw Error(TSR_ERR_IO, "OpenSSL's random source gave no bytes (RAND_bytes failed)");
  return out;
}

}  // namespace tessera
