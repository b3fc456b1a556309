// The rendezvous store's cryptography, from OpenSSL (Debian's libssl):
// SHA-256, HMAC-SHA256, a constant-time comparison and random bytes. A
// thin layer, so that callers see std::string and not OpenSSL's types;
// checked against FIPS 180-2's and RFC 4231's vectors
// (tests/unit/test_crypto.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace tessera {

using Sha256Digest = std::array<uint8_t, 32>;

// SHA-256 of data fed in pieces.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256 &) = delete;
  Sha256 &operator=(const Sha256 &) = delete;
  void update(const void *data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  Sha256Digest finish();

 private:
  evp_md_ctx_st *ctx_;
};

Sha256Digest sha256(std::string_view data);
Sha256Digest hmac_sha256(std::string_view key, std::string_view message);

// Lower-case hex of bytes.
std::string to_hex(const void *data, size_t n);
inline std::string to_hex(const Sha256Digest &d) {
  return to_hex(d.data(), d.size());
}

// Compares in time independent of where the first difference is (the
// lengths, which are public here, are compared first).
bool equal_constant_time(std::string_view a, std::string_view b);

// `n` bytes from OpenSSL's CSPRNG (seeded by the kernel); throws
// tessera::Error when it cannot give them.
std::string random_bytes(size_t n);

}  // namespace tessera
