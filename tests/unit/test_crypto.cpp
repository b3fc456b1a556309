// Known answers for the crypto the rendezvous store takes from OpenSSL:
// SHA-256 against FIPS 180-2's examples and HMAC-SHA256 against RFC 4231's
// test cases (the store's challenge-response rests on them).
#include <catch2/catch.hpp>
#include <string>

#include "util/crypto.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_crypto {

using tessera::hmac_sha256;
using tessera::sha256;
using tessera::to_hex;

TEST_CASE("SHA-256 matches FIPS 180-2", "[security][hmac]") {
  CHECK(to_hex(sha256("abc")) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces (the buffering across blocks).
  tessera::Sha256 h;
  const std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    const size_t n = std::min(left, chunk.size());
    h.update(chunk.data(), n);
    left -= n;
  }
  CHECK(to_hex(h.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("HMAC-SHA256 matches RFC 4231", "[security][hmac]") {
  // Test case 1.
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output.
  CHECK(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 3.
  CHECK(to_hex(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // Test case 4.
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  CHECK(to_hex(hmac_sha256(key4, std::string(50, '\xcd'))) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Test case 6: a key larger than the block, hashed first.
  CHECK(to_hex(hmac_sha256(std::string(131, '\xaa'),
                           "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // Test case 7: key and data larger than the block.
  CHECK(to_hex(hmac_sha256(
            std::string(131, '\xaa'),
            "This is a test using a larger than block-size key and a larger than block-size "
            "data. The key needs to be hashed before being used by the HMAC algorithm.")) ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST_CASE("constant-time comparison and random bytes", "[security][hmac]") {
  CHECK(tessera::equal_constant_time("abc", "abc"));
  CHECK(!tessera::equal_constant_time("abc", "abd"));
  CHECK(!tessera::equal_constant_time("abc", "abcd"));
  const std::string a = tessera::random_bytes(32), b = tessera::random_bytes(32);
  CHECK(a.size() == 32);
  CHECK(a != b);
}

}  // namespace unit_test_crypto
