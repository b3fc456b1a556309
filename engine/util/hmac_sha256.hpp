// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), written from their
// definitions: the rendezvous store's challenge-response needs nothing more,
// and no crypto library is a dependency. Checked against FIPS 180-2's and
// RFC 4231's test vectors (tests/unit/test_hmac_sha256.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void *data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  Sha256Digest finish();

 private:
  void block(const uint8_t *p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

Sha256Digest sha256(std::string_view data);
Sha256Digest hmac_sha256(std::string_view key, std::string_view message);

// Lower-case hex of bytes.
std::string to_hex(const void *data, size_t n);
inline std::string to_hex(const Sha256Digest &d) {
  return to_hex(d.data(), d.size());
}

// Compares in time independent of where the first difference is.
bool equal_constant_time(std::string_view a, std::string_view b);

// `n` bytes from the kernel's random source (getrandom, else /dev/urandom);
// throws tessera::Error when neither gives them.
std::string random_bytes(size_t n);

}  // namespace tessera
