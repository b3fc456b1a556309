// The CPU cast op added in ABI 1.1, against references written out
// independently here: float16/bfloat16 decoded with ldexp and rounded by
// searching the sorted table of representable values; and copy, which now
// takes any dtype as long as both sides agree. Linear, layernorm and
// embedding are in test_cpu_ops_nn11.cpp.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu_ops_nn11_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_cpu_ops_nn11_cast {

using Catch::Matchers::Contains;
using namespace tessera::test::cpu_ops_nn11_support;

// ---------------------------------------------------------------------------
// cast: references

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Decoders by arithmetic, not bit surgery: value = significand * 2^exponent.
double ref_f16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double mag = e == 0x1f ? std::numeric_limits<double>::infinity()  // (NaNs not asked)
                     : e == 0  ? std::ldexp(m, -24)
                               : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}
double ref_bf16_value(uint16_t h) {
  const int e = (h >> 7) & 0xff, m = h & 0x7f;
  const double mag = e == 0xff ? std::numeric_limits<double>::infinity()
                     : e == 0  ? std::ldexp(m, -133)
                               : std::ldexp(128 + m, e - 134);
  return (h & 0x8000) ? -mag : mag;
}

// Round-to-nearest-even by search: the non-negative finite patterns of a
// format are sorted by value, so find the last one <= |x| and pick between it
// and the next; an exact tie goes to the even pattern (even last mantissa
// bit). The infinity pattern stands for the next power of two, which is what
// IEEE rounding with an unbounded exponent would give: past the halfway
// point above the largest finite value, the answer is infinity.
template <typename Value>
uint16_t ref_round(double x, uint16_t inf_bits, Value value) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const double top = 2 * value(static_cast<uint16_t>(inf_bits - 1)) -
                     value(static_cast<uint16_t>(inf_bits - 2));  // the next power of two
  if (a >= top) return sign | inf_bits;
  uint16_t lo = 0, hi = inf_bits;  // value(lo) <= a < value(hi), value(inf) read as `top`
  auto val = [&](uint16_t p) { return p == inf_bits ? top : value(p); };
  while (hi - lo > 1) {
    const auto mid = static_cast<uint16_t>((lo + hi) / 2);
    (val(mid) <= a ? lo : hi) = mid;
  }
  const double dlo = a - val(lo), dhi = val(hi) - a;
  const uint16_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | pick;
}
uint16_t ref_f16(double x) {
  return ref_round(x, 0x7c00, ref_f16_value);
}
uint16_t ref_bf16(double x) {
  return ref_round(x, 0x7f80, ref_bf16_value);
}

bool f16_is_nan(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}
bool bf16_is_nan(uint16_t h) {
  return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
}

// The op on a whole vector.
std::vector<uint16_t> cast_from_f32(const std::vector<float> &x, DLDataType to) {
  F32 src({static_cast<int64_t>(x.size())});
  src.v = x;
  U16 dst({static_cast<int64_t>(x.size())}, to);
  REQUIRE(ops().cast(nullptr, src.dl(), dst.dl()) == TSR_OK);
  return dst.v;
}
std::vector<float> cast_to_f32(const std::vector<uint16_t> &x, DLDataType from) {
  U16 src({static_cast<int64_t>(x.size())}, from);
  src.v = x;
  F32 dst({static_cast<int64_t>(x.size())});
  REQUIRE(ops().cast(nullptr, src.dl(), dst.dl()) == TSR_OK);
  return dst.v;
}
std::vector<uint16_t> cast_16(const std::vector<uint16_t> &x, DLDataType from, DLDataType to) {
  U16 src({static_cast<int64_t>(x.size())}, from), dst({static_cast<int64_t>(x.size())}, to);
  src.v = x;
  REQUIRE(ops().cast(nullptr, src.dl(), dst.dl()) == TSR_OK);
  return dst.v;
}

std::vector<uint16_t> every_pattern() {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; i++) all[i] = static_cast<uint16_t>(i);
  return all;
}

}  // namespace

// ---------------------------------------------------------------------------
// cast: known bit patterns, worked out by hand

TEST_CASE("cast float32 to bfloat16 and float16: known bit patterns", "[ops]") {
  struct Case {
    float x;
    uint16_t bf16, f16;
  };
  const Case cases[] = {
      {1.0f, 0x3f80, 0x3c00},
      {-2.0f, 0xc000, 0xc000},
      {0.0f, 0x0000, 0x0000},
      {-0.0f, 0x8000, 0x8000},
      // 1/3 = 0x3eaaaaab. bf16 keeps 0x3eaa and drops 0xaaab > 0x8000: up to
      // 0x3eab. f16: 1.0101010101|0101... x 2^-2, exponent 13 -> 0x3400, the
      // ten kept bits 0101010101 = 0x155, the rest below half: 0x3555.
      {1.0f / 3.0f, 0x3eab, 0x3555},
      // 65504 = 0x477fe000, float16's largest finite (0x7bff). bf16 drops
      // 0xe000 > 0x8000 and rounds up to 0x4780 = 65536.
      {65504.0f, 0x4780, 0x7bff},
      // Just under the tie 65520 (between 65504 and "65536") stays finite;
      // 65520 ties and goes to even, which is 65536 = infinity in f16.
      {65519.0f, 0x4780, 0x7bff},
      {65520.0f, 0x4780, 0x7c00},
      {1e5f, 0x47c3, 0x7c00},  // 1e5 = 0x47c35000: bf16 drops 0x5000 < half
      // bf16 ties (1 + 2^-8 = 0x3f808000 sits halfway between 0x3f80 and
      // 0x3f81; even is 0x3f80) and (1 + 3 * 2^-8 = 0x3f818000, halfway between
      // 0x3f81 and 0x3f82; even is 0x3f82). In f16 both are exact: 1 + 2^-8 =
      // 0x3c00 + 4, 1 + 3 * 2^-8 = 0x3c00 + 12.
      {1.0f + 0x1p-8f, 0x3f80, 0x3c04},
      {1.0f + 3 * 0x1p-8f, 0x3f82, 0x3c0c},
      // f16 ties: 1 + 2^-11 is halfway between 0x3c00 and 0x3c01 -> 0x3c00;
      // 1 + 3 * 2^-11 halfway between 0x3c01 and 0x3c02 -> 0x3c02. In steps of
      // 2 above 2048: 2049 -> 2048 (0x6800), 2051 -> 2052 (0x6802). (bf16
      // has 8 bits of precision: all four round to 1.0 or to 2048/2048/2048/2048
      // = 0x4500, 2051 to 0x4500 too since 3 < 8/2.)
      {1.0f + 0x1p-11f, 0x3f80, 0x3c00},
      {1.0f + 3 * 0x1p-11f, 0x3f80, 0x3c02},
      {2049.0f, 0x4500, 0x6800},
      {2051.0f, 0x4500, 0x6802},
      // f16 subnormals, in units of 2^-24: 2^-24 is 0x0001; 2^-25 is the tie
      // between 0 and 1 unit -> 0 (even); 1.5 * 2^-25 is past it -> 1;
      // 1.5 * 2^-24 ties between 1 and 2 units -> 2; 2^-14 is the smallest
      // normal 0x0400; 1023 units is the largest subnormal 0x03ff. bf16 has
      // float32's exponent range, so these are all normal there: 2^-24 =
      // 0x3380, 2^-25 = 0x3300, 1.5 * 2^-25 = 0x3340, 1.5 * 2^-24 = 0x33c0,
      // 2^-14 = 0x3880, and 1023 * 2^-24 = (2 - 2^-9) 2^-15 rounds up to
      // 2^-14 = 0x3880 in bf16.
      {0x1p-24f, 0x3380, 0x0001},
      {0x1p-25f, 0x3300, 0x0000},
      {1.5f * 0x1p-25f, 0x3340, 0x0001},
      {1.5f * 0x1p-24f, 0x33c0, 0x0002},
      {0x1p-14f, 0x3880, 0x0400},
      {1023 * 0x1p-24f, 0x3880, 0x03ff},
      {-0x1p-24f, 0xb380, 0x8001},
      {0x1p-30f, 0x3080, 0x0000},  // far below f16's range: zero
      // float32 subnormals (bits 0x00010000 = 2^-133, bf16's smallest
      // subnormal 0x0001; 0x00018000 ties between 0x0001 and 0x0002 -> 0x0002).
      {float_of(0x00010000), 0x0001, 0x0000},
      {float_of(0x00018000), 0x0002, 0x0000},
      {float_of(0x00008000), 0x0000, 0x0000},
      // The largest float rounds past bf16's largest finite to infinity.
      {std::numeric_limits<float>::max(), 0x7f80, 0x7c00},
      {std::numeric_limits<float>::infinity(), 0x7f80, 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xff80, 0xfc00},
  };
  std::vector<float> xs;
  for (const Case &c : cases) xs.push_back(c.x);
  const std::vector<uint16_t> bf = cast_from_f32(xs, kBF16), hf = cast_from_f32(xs, kF16);
  for (size_t i = 0; i < xs.size(); i++) {
    INFO("x = " << xs[i] << " (bits 0x" << std::hex << bits_of(xs[i]) << ")" << std::dec);
    CHECK(bf[i] == cases[i].bf16);
    CHECK(hf[i] == cases[i].f16);
    // The hand-worked answers agree with the search reference.
    CHECK(ref_bf16(xs[i]) == cases[i].bf16);
    CHECK(ref_f16(xs[i]) == cases[i].f16);
  }
}

TEST_CASE("cast keeps NaN a NaN, sign included", "[ops]") {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  // A signalling NaN whose only payload bit is the lowest: truncating it
  // would give infinity in both formats.
  const float snan = float_of(0x7f800001u), neg_nan = float_of(0xffc00000u);
  const std::vector<float> xs = {qnan, snan, neg_nan};
  const std::vector<uint16_t> bf = cast_from_f32(xs, kBF16), hf = cast_from_f32(xs, kF16);
  for (size_t i = 0; i < xs.size(); i++) {
    CHECK(bf16_is_nan(bf[i]));
    CHECK(f16_is_nan(hf[i]));
  }
  CHECK((bf[2] & 0x8000) != 0);
  CHECK((hf[2] & 0x8000) != 0);
  // And back: every NaN pattern of either format widens to a float32 NaN.
  const std::vector<uint16_t> nans = {0x7c01, 0x7e00, 0xfdff, 0x7fff};
  for (float f : cast_to_f32(nans, kF16)) CHECK(std::isnan(f));
  const std::vector<uint16_t> bnans = {0x7f81, 0x7fc0, 0xffff};
  for (float f : cast_to_f32(bnans, kBF16)) CHECK(std::isnan(f));
  // And across: f16 NaN -> bf16 NaN and back.
  for (uint16_t h : cast_16(nans, kF16, kBF16)) CHECK(bf16_is_nan(h));
  for (uint16_t h : cast_16(bnans, kBF16, kF16)) CHECK(f16_is_nan(h));
}

TEST_CASE("cast widens every float16 and bfloat16 exactly and narrows back", "[ops]") {
  const std::vector<uint16_t> all = every_pattern();
  SECTION("float16") {
    const std::vector<float> wide = cast_to_f32(all, kF16);
    const std::vector<uint16_t> back = cast_from_f32(wide, kF16);
    for (uint32_t i = 0; i < 65536; i++) {
      const auto h = static_cast<uint16_t>(i);
      INFO("f16 0x" << std::hex << i);
      if (f16_is_nan(h)) {
        REQUIRE(std::isnan(wide[i]));
        REQUIRE(f16_is_nan(back[i]));
      } else {
        REQUIRE(static_cast<double>(wide[i]) == ref_f16_value(h));
        REQUIRE(std::signbit(wide[i]) == ((h & 0x8000) != 0));  // -0 stays -0
        REQUIRE(back[i] == h);
      }
    }
  }
  SECTION("bfloat16") {
    const std::vector<float> wide = cast_to_f32(all, kBF16);
    const std::vector<uint16_t> back = cast_from_f32(wide, kBF16);
    for (uint32_t i = 0; i < 65536; i++) {
      const auto h = static_cast<uint16_t>(i);
      INFO("bf16 0x" << std::hex << i);
      if (bf16_is_nan(h)) {
        REQUIRE(std::isnan(wide[i]));
        REQUIRE(bf16_is_nan(back[i]));
      } else {
        REQUIRE(static_cast<double>(wide[i]) == ref_bf16_value(h));
        REQUIRE(back[i] == h);
      }
    }
  }
}

TEST_CASE("cast between bfloat16 and float16 rounds once, like via float32", "[ops]") {
  const std::vector<uint16_t> all = every_pattern();
  const std::vector<uint16_t> to_f16 = cast_16(all, kBF16, kF16);
  const std::vector<uint16_t> to_bf16 = cast_16(all, kF16, kBF16);
  for (uint32_t i = 0; i < 65536; i++) {
    const auto h = static_cast<uint16_t>(i);
    INFO("pattern 0x" << std::hex << i);
    if (!bf16_is_nan(h)) REQUIRE(to_f16[i] == ref_f16(ref_bf16_value(h)));
    if (!f16_is_nan(h)) REQUIRE(to_bf16[i] == ref_bf16(ref_f16_value(h)));
  }
  // Two by hand: bf16 0x3f81 = 1 + 2^-7 is exact in f16 (0x3c00 + 8); f16
  // 0x3555 = 0.333251953125 = 0x3eaaa000 in float32, whose dropped half
  // 0xa000 > 0x8000 rounds bf16 up to 0x3eab.
  CHECK(cast_16({0x3f81}, kBF16, kF16)[0] == 0x3c08);
  CHECK(cast_16({0x3555}, kF16, kBF16)[0] == 0x3eab);
  CHECK(cast_16({0x4780}, kBF16, kF16)[0] == 0x7c00);  // 65536: past f16's range
}

TEST_CASE("cast float32 to 16 bits matches the reference on random bit patterns", "[ops]") {
  // Uniform over bit patterns: every exponent is as likely, so subnormals,
  // the f16 range's edges and huge values are all well covered.
  std::mt19937 rng(1234);
  std::vector<float> xs;
  while (xs.size() < 100000) {
    const float f = float_of(static_cast<uint32_t>(rng()));
    if (!std::isnan(f)) xs.push_back(f);
  }
  // And a dense sweep around f16's subnormal and overflow boundaries.
  for (float base : {0x1p-24f, 0x1p-14f, 65504.0f, 1.0f}) {
    uint32_t u = bits_of(base) - 3000;
    for (int i = 0; i < 6000; i++) xs.push_back(float_of(u++));
  }
  const std::vector<uint16_t> bf = cast_from_f32(xs, kBF16), hf = cast_from_f32(xs, kF16);
  for (size_t i = 0; i < xs.size(); i++) {
    INFO("x = " << xs[i] << " (bits 0x" << std::hex << bits_of(xs[i]) << ")");
    REQUIRE(bf[i] == ref_bf16(xs[i]));
    REQUIRE(hf[i] == ref_f16(xs[i]));
  }
}

TEST_CASE("cast: same dtype copies, in place too, N-D shapes, pinned host memory", "[ops]") {
  F32 x({2, 3}), y({6});
  randomize(x.v, 1);
  REQUIRE(ops().cast(nullptr, x.dl(), y.dl()) == TSR_OK);
  CHECK(y.v == x.v);
  REQUIRE(ops().cast(nullptr, x.dl(), x.dl()) == TSR_OK);  // a no-op
  CHECK(y.v == x.v);

  U16 h({3, 2}, kBF16);
  DLTensor *hd = h.dl();
  hd->device = DLDevice{kDLCUDAHost, 0};
  REQUIRE(ops().cast(nullptr, x.dl(), hd) == TSR_OK);
  for (size_t i = 0; i < 6; i++) CHECK(h.v[i] == ref_bf16(x.v[i]));

  F32 empty({0}), empty2({2, 0});
  U16 empty16({0}, kF16);
  CHECK(ops().cast(nullptr, empty.dl(), empty16.dl()) == TSR_OK);
  CHECK(ops().cast(nullptr, empty2.dl(), empty16.dl()) == TSR_OK);
}

TEST_CASE("cast rejects bad arguments", "[ops]") {
  Msgs m;
  F32 x({4});
  U16 h({4}, kF16);
  SECTION("element counts differ") {
    U16 h5({5}, kF16);
    CHECK(ops().cast(m.ctx(), x.dl(), h5.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("cast: x float32[4] and y float16[5] differ in element count"));
  }
  SECTION("unsupported dtypes") {
    I32 ids({4});
    CHECK(ops().cast(m.ctx(), ids.dl(), h.dl()) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(m.last(), Contains("cast: x must be float32, bfloat16 or float16, got int32[4]"));
    Buf<double> d({4}, DLDataType{kDLFloat, 64, 1});
    CHECK(ops().cast(m.ctx(), x.dl(), d.dl()) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(m.last(), Contains("cast: y must be"));
  }
  SECTION("overlap between different dtypes") {
    // y viewed over x's own bytes: widening in place would read what it wrote.
    DLTensor hd = *h.dl();
    hd.data = x.v.data();
    CHECK(ops().cast(m.ctx(), x.dl(), &hd) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("overlap"));
  }
  SECTION("device") {
    DLTensor *xd = x.dl();
    xd->device = DLDevice{kDLCUDA, 0};
    CHECK(ops().cast(m.ctx(), xd, h.dl()) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(m.last(), Contains("cast: x"));
  }
  SECTION("misaligned") {
    F32 x3({3});
    h.shape = {3};
    DLTensor *hd = h.dl();
    hd->byte_offset = 1;
    CHECK(ops().cast(m.ctx(), x3.dl(), hd) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("cast: y float16[3] is misaligned (byte_offset 1)"));
  }
}

// ---------------------------------------------------------------------------
// copy now takes any dtype, as long as both sides agree

TEST_CASE("copy moves any dtype when src and dst agree", "[ops]") {
  Msgs m;
  U16 a({2, 3}, kBF16), b({6}, kBF16);
  for (size_t i = 0; i < 6; i++) a.v[i] = static_cast<uint16_t>(0x3f80 + i);
  REQUIRE(ops().copy(m.ctx(), a.dl(), b.dl()) == TSR_OK);
  CHECK(b.v == a.v);

  I32 ids({5}), ids2({5});
  for (int i = 0; i < 5; i++) ids.v[static_cast<size_t>(i)] = 100 - i;
  DLTensor *d2 = ids2.dl();
  d2->device = DLDevice{kDLCUDAHost, 0};
  REQUIRE(ops().copy(m.ctx(), ids.dl(), d2) == TSR_OK);
  CHECK(ids2.v == ids.v);

  U16 f16({6}, kF16);
  CHECK(ops().copy(m.ctx(), a.dl(), f16.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Contains("copy: src bfloat16[2,3] and dst float16[6] differ in dtype"));
  U16 b7({7}, kBF16);
  CHECK(ops().copy(m.ctx(), a.dl(), b7.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(m.last(), Contains("differ in element count"));
  Buf<uint8_t> bits({6}, DLDataType{kDLUInt, 1, 8});  // 1-bit lanes: not whole bytes
  CHECK(ops().copy(m.ctx(), bits.dl(), bits.dl()) == TSR_ERR_UNSUPPORTED);
}

}  // namespace unit_test_cpu_ops_nn11_cast
