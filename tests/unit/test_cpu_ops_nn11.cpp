// The CPU ops added in ABI 1.1 (cast, linear, layernorm, embedding), against
// references written out independently here: float16/bfloat16 decoded with
// ldexp and rounded by searching the sorted table of representable values,
// linear against the matmul + bias_act it stands for, layernorm against a
// double-precision forward and central differences of it, embedding against
// plain loops. Attention has its own tests.
#include <tessera/ops.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "host/host.hpp"
#include "ops/cpu_ops.hpp"

using Catch::Matchers::Contains;

namespace {

const tsr_ops &ops() {
  return *tessera::cpu_ops();
}

constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kBF16{kDLBfloat, 16, 1};
constexpr DLDataType kF16{kDLFloat, 16, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};

int64_t numel_of(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// An owning host tensor of element type T (storage) and DLPack dtype `dtype`
// (float16 and bfloat16 are stored as uint16_t). dl() rebuilds the DLTensor
// so a test can break one field on purpose.
template <typename T>
struct Buf {
  std::vector<int64_t> shape;
  std::vector<T> v;
  DLDataType dtype;
  DLTensor t{};
  Buf(std::vector<int64_t> s, DLDataType d, T init = T(0))
      : shape(std::move(s)), v(static_cast<size_t>(numel_of(shape)), init), dtype(d) {}
  DLTensor *dl() {
    t.data = v.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    return &t;
  }
};

struct F32 : Buf<float> {
  explicit F32(std::vector<int64_t> s, float init = 0.0f) : Buf(std::move(s), kF32, init) {}
};
struct I32 : Buf<int32_t> {
  explicit I32(std::vector<int64_t> s, int32_t init = 0) : Buf(std::move(s), kI32, init) {}
};
using U16 = Buf<uint16_t>;  // bfloat16 or float16 bits

void randomize(std::vector<float> &x, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (float &e : x) e = u(rng);
}

bool close(double got, double want, double tol) {
  return std::fabs(got - want) <= tol * (1.0 + std::fabs(want));
}

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

// A host to read error messages from (the ops drop them when ctx is NULL).
struct Msgs {
  tessera::Host host{tessera::Host::RunFacts{}};
  tsr_host_ctx *ctx() { return host.ctx(); }
  std::string last() { return host.last_error(); }
};

}  // namespace

TEST_CASE("cpu ops table has every ABI 1.1 entry", "[ops]") {
  const tsr_ops &o = ops();
  CHECK(TSR_HAS_FIELD(&o, tsr_ops, attention_backward));
  CHECK(o.cast);
  CHECK(o.linear);
  CHECK(o.layernorm_forward);
  CHECK(o.layernorm_backward);
  CHECK(o.embedding_forward);
  CHECK(o.embedding_backward);
  CHECK(o.attention_forward);
  CHECK(o.attention_backward);
}

// ---------------------------------------------------------------------------
// cast: references

namespace {

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

TEST_CASE("cast: same dtype copies, in place too; N-D shapes; pinned host memory", "[ops]") {
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

// ---------------------------------------------------------------------------
// linear

namespace {

double ref_act(tsr_activation act, double x) {
  switch (act) {
    case TSR_ACT_RELU:
      return x > 0 ? x : 0;
    case TSR_ACT_TANH:
      return std::tanh(x);
    case TSR_ACT_GELU:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    default:
      return x;
  }
}

void check_linear(int64_t m, int64_t n, int64_t k, int ta, int tb, bool with_bias,
                  tsr_activation act, bool with_pre, uint32_t seed) {
  INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb
            << " bias=" << with_bias << " act=" << act << " pre=" << with_pre);
  // a as [2, m/2, k] (or its transpose) to exercise the N-D view of a and c.
  const std::vector<int64_t> ashape =
      ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{2, m / 2, k};
  F32 a(ashape), b(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}), bias({n});
  F32 c({2, m / 2, n}, 7.0f), pre({m, n}, 7.0f);  // stale values: must be overwritten
  randomize(a.v, seed);
  randomize(b.v, seed + 1);
  randomize(bias.v, seed + 2);
  REQUIRE(ops().linear(nullptr, a.dl(), ta, b.dl(), tb, with_bias ? bias.dl() : nullptr, act,
                       c.dl(), with_pre ? pre.dl() : nullptr) == TSR_OK);

  // What linear stands for: matmul, then bias_act (a zero bias when none).
  F32 z({m, n}), zero({n});
  REQUIRE(ops().matmul(nullptr, a.dl(), ta, b.dl(), tb, z.dl(), 1.0f, 0.0f) == TSR_OK);
  F32 zpre = z;
  REQUIRE(ops().bias_act(nullptr, zpre.dl(), with_bias ? bias.dl() : zero.dl(), TSR_ACT_NONE) ==
          TSR_OK);
  REQUIRE(ops().bias_act(nullptr, z.dl(), with_bias ? bias.dl() : zero.dl(), act) == TSR_OK);
  for (size_t i = 0; i < z.v.size(); i++) {
    INFO("element " << i);
    REQUIRE(c.v[i] == Approx(z.v[i]).epsilon(1e-6).margin(1e-6));
    if (with_pre) REQUIRE(pre.v[i] == zpre.v[i]);
  }
  if (!with_pre) {
    for (float e : pre.v) REQUIRE(e == 7.0f);  // untouched
  }

  // And a double-precision spot check of the math itself.
  for (int64_t i = 0; i < m; i += 3) {
    for (int64_t j = 0; j < n; j += 2) {
      double s = with_bias ? bias.v[static_cast<size_t>(j)] : 0.0;
      for (int64_t p = 0; p < k; p++)
        s += double(ta ? a.v[p * m + i] : a.v[i * k + p]) * (tb ? b.v[j * k + p] : b.v[p * n + j]);
      REQUIRE(close(c.v[i * n + j], ref_act(act, s), 1e-5));
    }
  }
}

}  // namespace

TEST_CASE("linear equals matmul then bias_act, for each activation and transpose", "[ops]") {
  uint32_t seed = 100;
  for (tsr_activation act : {TSR_ACT_NONE, TSR_ACT_RELU, TSR_ACT_GELU, TSR_ACT_TANH}) {
    for (int ta = 0; ta < 2; ta++) {
      for (int tb = 0; tb < 2; tb++) {
        check_linear(6, 5, 7, ta, tb, true, act, false, seed++);
        check_linear(6, 5, 7, ta, tb, true, act, true, seed++);
        check_linear(6, 5, 7, ta, tb, false, act, false, seed++);
        check_linear(6, 5, 7, ta, tb, false, act, true, seed++);
      }
    }
    check_linear(34, 65, 130, 0, 1, true, act, true, seed++);
  }
}

TEST_CASE("linear: pre may be c itself", "[ops]") {
  F32 a({3, 4}), b({4, 5}), bias({5}), c({3, 5}), want({3, 5}), want_pre({3, 5});
  randomize(a.v, 1);
  randomize(b.v, 2);
  randomize(bias.v, 3);
  REQUIRE(ops().linear(nullptr, a.dl(), 0, b.dl(), 0, bias.dl(), TSR_ACT_GELU, want.dl(),
                       want_pre.dl()) == TSR_OK);
  REQUIRE(ops().linear(nullptr, a.dl(), 0, b.dl(), 0, bias.dl(), TSR_ACT_GELU, c.dl(), c.dl()) ==
          TSR_OK);
  CHECK(c.v == want.v);  // the activation wins: it is written last
}

TEST_CASE("linear rejects bad arguments, naming linear", "[ops]") {
  Msgs m;
  F32 a({4, 3}), b({3, 5}), bias({5}), c({4, 5}), pre({4, 5});
  SECTION("inner dims differ") {
    CHECK(ops().linear(m.ctx(), a.dl(), 1, b.dl(), 0, bias.dl(), 0, c.dl(), nullptr) ==
          TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("linear: inner dimensions differ"));
  }
  SECTION("bias of the wrong size") {
    F32 bias4({4});
    CHECK(ops().linear(m.ctx(), a.dl(), 0, b.dl(), 0, bias4.dl(), 0, c.dl(), nullptr) ==
          TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("linear: bias float32[4] must have the last dim of c"));
  }
  SECTION("pre of the wrong shape") {
    F32 pre2({5, 4});
    CHECK(ops().linear(m.ctx(), a.dl(), 0, b.dl(), 0, bias.dl(), 0, c.dl(), pre2.dl()) ==
          TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("linear: pre float32[5,4] must have the shape of c"));
  }
  SECTION("unknown activation") {
    CHECK(ops().linear(m.ctx(), a.dl(), 0, b.dl(), 0, bias.dl(), 9, c.dl(), nullptr) ==
          TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("linear: unknown activation 9"));
  }
  SECTION("c has the wrong shape: nothing written") {
    F32 c2({5, 4}, 3.0f);
    CHECK(ops().linear(m.ctx(), a.dl(), 0, b.dl(), 0, nullptr, 0, c2.dl(), nullptr) ==
          TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("linear: c must be 4x5"));
    for (float e : c2.v) CHECK(e == 3.0f);
  }
  SECTION("bfloat16 operands are the CUDA ops' business") {
    DLTensor *ad = a.dl();
    ad->dtype = kBF16;
    CHECK(ops().linear(m.ctx(), ad, 0, b.dl(), 0, bias.dl(), 0, c.dl(), nullptr) ==
          TSR_ERR_UNSUPPORTED);
    CHECK_THAT(m.last(), Contains("linear: a must be float32"));
  }
}

// ---------------------------------------------------------------------------
// layernorm

namespace {

struct LnRef {
  std::vector<double> y, mean, rstd;
};

// Straight from the definition, in double.
LnRef ref_layernorm(const std::vector<double> &x, const std::vector<double> &w,
                    const std::vector<double> &b, int64_t rows, int64_t C, double eps) {
  LnRef r;
  r.y.resize(x.size());
  for (int64_t i = 0; i < rows; i++) {
    double mu = 0;
    for (int64_t j = 0; j < C; j++) mu += x[i * C + j];
    mu /= double(C);
    double var = 0;
    for (int64_t j = 0; j < C; j++) var += (x[i * C + j] - mu) * (x[i * C + j] - mu);
    var /= double(C);
    const double rs = 1 / std::sqrt(var + eps);
    for (int64_t j = 0; j < C; j++) r.y[i * C + j] = (x[i * C + j] - mu) * rs * w[j] + b[j];
    r.mean.push_back(mu);
    r.rstd.push_back(rs);
  }
  return r;
}

std::vector<double> wide(const std::vector<float> &v) {
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("layernorm_forward matches a double-precision reference", "[ops]") {
  const float eps = 1e-5f;
  for (int64_t C : {1, 7, 64, 768}) {
    for (float offset : {0.0f, 300.0f}) {  // a large mean tests the two-pass variance
      INFO("C=" << C << " offset=" << offset);
      const int64_t rows = 6;
      F32 x({2, 3, C}), w({C}), b({C}), y({2, 3, C}), mean({2, 3}), rstd({6});
      randomize(x.v, uint32_t(C), offset - 1.5f, offset + 1.5f);
      randomize(w.v, uint32_t(C) + 1, 0.5f, 1.5f);
      randomize(b.v, uint32_t(C) + 2);
      REQUIRE(ops().layernorm_forward(nullptr, x.dl(), w.dl(), b.dl(), eps, y.dl(), mean.dl(),
                                      rstd.dl()) == TSR_OK);
      const LnRef r = ref_layernorm(wide(x.v), wide(w.v), wide(b.v), rows, C, eps);
      for (int64_t i = 0; i < rows; i++) {
        REQUIRE(close(mean.v[i], r.mean[i], 1e-6));
        REQUIRE(close(rstd.v[i], r.rstd[i], 1e-5));
      }
      for (size_t i = 0; i < y.v.size(); i++) REQUIRE(close(y.v[i], r.y[i], 1e-5));
    }
  }
}

TEST_CASE("layernorm_forward: a constant row normalizes to the bias; in place", "[ops]") {
  F32 x({2, 4}, 3.0f), w({4}, 2.0f), b({4}), y({2, 4}), mean({2}), rstd({2});
  b.v = {1, 2, 3, 4};
  REQUIRE(ops().layernorm_forward(nullptr, x.dl(), w.dl(), b.dl(), 1e-5f, y.dl(), mean.dl(),
                                  rstd.dl()) == TSR_OK);
  CHECK(mean.v[0] == 3.0f);
  CHECK(rstd.v[0] == Approx(1 / std::sqrt(1e-5)).epsilon(1e-6));
  CHECK(y.v == std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4});

  // y may be x.
  F32 x2({3, 5}), y2({3, 5}), w2({5}), b2({5});
  randomize(x2.v, 9);
  randomize(w2.v, 10);
  randomize(b2.v, 11);
  REQUIRE(ops().layernorm_forward(nullptr, x2.dl(), w2.dl(), b2.dl(), 1e-5f, y2.dl(), mean.dl(),
                                  rstd.dl()) != TSR_OK);  // mean/rstd of 2 for 3 rows: refused
  F32 m3({3}), r3({3});
  REQUIRE(ops().layernorm_forward(nullptr, x2.dl(), w2.dl(), b2.dl(), 1e-5f, y2.dl(), m3.dl(),
                                  r3.dl()) == TSR_OK);
  REQUIRE(ops().layernorm_forward(nullptr, x2.dl(), w2.dl(), b2.dl(), 1e-5f, x2.dl(), m3.dl(),
                                  r3.dl()) == TSR_OK);
  CHECK(x2.v == y2.v);
}

TEST_CASE("layernorm_backward matches finite differences, and accumulates", "[ops]") {
  // Loss L = sum(y * g) for a fixed random g, so dL/dy = g. The reference
  // gradients are central differences of the double-precision forward.
  const int64_t rows = 4, C = 9;
  const double eps = 1e-5;
  F32 x({2, 2, C}), w({C}), b({C}), y({rows, C}), mean({rows}), rstd({rows}), g({rows, C});
  randomize(x.v, 21);
  randomize(w.v, 22, 0.5f, 1.5f);
  randomize(b.v, 23);
  randomize(g.v, 24);
  REQUIRE(ops().layernorm_forward(nullptr, x.dl(), w.dl(), b.dl(), float(eps), y.dl(), mean.dl(),
                                  rstd.dl()) == TSR_OK);
  // Gradients land on top of what is there.
  F32 dx({rows, C}, 0.25f), dw({C}, -1.0f), db({C}, 2.0f);
  REQUIRE(ops().layernorm_backward(nullptr, g.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(), dx.dl(),
                                   dw.dl(), db.dl()) == TSR_OK);

  std::vector<double> xd = wide(x.v), wd = wide(w.v), bd = wide(b.v);
  auto loss = [&] {
    const LnRef r = ref_layernorm(xd, wd, bd, rows, C, eps);
    double s = 0;
    for (size_t i = 0; i < r.y.size(); i++) s += r.y[i] * g.v[i];
    return s;
  };
  auto numeric = [&](double &v) {
    const double h = 1e-5, v0 = v;
    v = v0 + h;
    const double up = loss();
    v = v0 - h;
    const double down = loss();
    v = v0;
    return (up - down) / (2 * h);
  };
  for (size_t i = 0; i < xd.size(); i++) {
    INFO("dx[" << i << "]");
    REQUIRE(close(dx.v[i] - 0.25, numeric(xd[i]), 2e-4));
  }
  for (size_t j = 0; j < size_t(C); j++) {
    INFO("dweight/dbias[" << j << "]");
    REQUIRE(close(dw.v[j] + 1.0, numeric(wd[j]), 2e-4));
    REQUIRE(close(db.v[j] - 2.0, numeric(bd[j]), 2e-4));
  }
}

TEST_CASE("layernorm_backward sums the parameter gradients over rows in double", "[ops]") {
  // 50000 rows of dy = 0.1f: a float running sum drifts by far more than the
  // bound below; a double one is exact to float precision.
  const int64_t rows = 50000, C = 3;
  F32 x({rows, C}), w({C}, 1.0f), b({C}), y({rows, C}), mean({rows}), rstd({rows});
  for (int64_t i = 0; i < rows; i++) {
    x.v[size_t(i * C)] = -1.0f;
    x.v[size_t(i * C + 1)] = 0.0f;
    x.v[size_t(i * C + 2)] = 1.0f;
  }
  REQUIRE(ops().layernorm_forward(nullptr, x.dl(), w.dl(), b.dl(), 0.0f, y.dl(), mean.dl(),
                                  rstd.dl()) == TSR_OK);
  F32 dy({rows, C}, 0.1f), dx({rows, C}), dw({C}), db({C});
  REQUIRE(ops().layernorm_backward(nullptr, dy.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(), dx.dl(),
                                   dw.dl(), db.dl()) == TSR_OK);
  const double want_db = rows * double(0.1f);
  for (int64_t j = 0; j < C; j++) CHECK(std::fabs(db.v[size_t(j)] - want_db) <= 1e-6 * want_db);
  // n = (-sqrt(1.5), 0, sqrt(1.5)) in every row.
  CHECK(dw.v[0] == Approx(-want_db * std::sqrt(1.5)).epsilon(1e-6));
  CHECK(dw.v[1] == Approx(0.0).margin(1e-3));
  // A constant dy has no component the normalization lets through: dx = 0.
  for (float e : dx.v) REQUIRE(std::fabs(e) < 1e-6f);
}

TEST_CASE("layernorm rejects bad arguments, naming the op and argument", "[ops]") {
  Msgs m;
  F32 x({3, 4}), w({4}), b({4}), y({3, 4}), mean({3}), rstd({3});
  SECTION("forward: weight size") {
    F32 w5({5});
    CHECK(ops().layernorm_forward(m.ctx(), x.dl(), w5.dl(), b.dl(), 1e-5f, y.dl(), mean.dl(),
                                  rstd.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("layernorm_forward: weight float32[5] must have 4 elements"));
  }
  SECTION("forward: y shape") {
    F32 y2({4, 3});
    CHECK(ops().layernorm_forward(m.ctx(), x.dl(), w.dl(), b.dl(), 1e-5f, y2.dl(), mean.dl(),
                                  rstd.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("layernorm_forward: y float32[4,3] must have the shape of x"));
  }
  SECTION("forward: rstd missing") {
    CHECK(ops().layernorm_forward(m.ctx(), x.dl(), w.dl(), b.dl(), 1e-5f, y.dl(), mean.dl(),
                                  nullptr) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("layernorm_forward: rstd is NULL"));
  }
  SECTION("forward: negative eps") {
    CHECK(ops().layernorm_forward(m.ctx(), x.dl(), w.dl(), b.dl(), -1.0f, y.dl(), mean.dl(),
                                  rstd.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("eps"));
  }
  SECTION("backward: mean size") {
    F32 mean4({4}), dx({3, 4}), dw({4}), db({4});
    CHECK(ops().layernorm_backward(m.ctx(), y.dl(), x.dl(), w.dl(), mean4.dl(), rstd.dl(), dx.dl(),
                                   dw.dl(), db.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("layernorm_backward: mean float32[4] must have 3 elements"));
  }
  SECTION("backward: dbias dtype") {
    F32 dx({3, 4}), dw({4});
    U16 db({4}, kBF16);
    CHECK(ops().layernorm_backward(m.ctx(), y.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(), dx.dl(),
                                   dw.dl(), db.dl()) == TSR_ERR_UNSUPPORTED);
    CHECK_THAT(m.last(), Contains("layernorm_backward: dbias must be float32"));
  }
}

// ---------------------------------------------------------------------------
// embedding

TEST_CASE("embedding_forward gathers rows, or adds them", "[ops]") {
  const int64_t V = 5, C = 3;
  F32 table({V, C});
  randomize(table.v, 31);
  I32 ids({2, 3});
  ids.v = {4, 0, 4, 2, 2, 1};  // repeats on purpose
  F32 out({2, 3, C}, 9.0f);
  REQUIRE(ops().embedding_forward(nullptr, ids.dl(), table.dl(), out.dl(), 0) == TSR_OK);
  for (size_t i = 0; i < 6; i++)
    for (size_t j = 0; j < size_t(C); j++)
      REQUIRE(out.v[i * C + j] == table.v[size_t(ids.v[i]) * C + j]);

  // accumulate = 1: a second table (positions, say) added on top.
  F32 pos({6, C});
  randomize(pos.v, 32);
  I32 pids({6});
  pids.v = {0, 1, 2, 3, 4, 5};
  const std::vector<float> before = out.v;
  REQUIRE(ops().embedding_forward(nullptr, pids.dl(), pos.dl(), out.dl(), 1) == TSR_OK);
  for (size_t i = 0; i < out.v.size(); i++) REQUIRE(out.v[i] == before[i] + pos.v[i]);
}

TEST_CASE("embedding_backward scatter-adds, repeated ids summing", "[ops]") {
  const int64_t V = 4, C = 2;
  I32 ids({5});
  ids.v = {1, 3, 1, 1, 0};
  F32 dout({5, C}), dtable({V, C}, 0.5f);
  dout.v = {1, 2, 3, 4, 10, 20, 100, 200, 1000, 2000};
  REQUIRE(ops().embedding_backward(nullptr, ids.dl(), dout.dl(), dtable.dl()) == TSR_OK);
  // Row 1 gets rows 0, 2 and 3 of dout; row 2 nothing; all on top of 0.5.
  const std::vector<float> want = {1000.5f, 2000.5f, 111.5f, 222.5f, 0.5f, 0.5f, 3.5f, 4.5f};
  CHECK(dtable.v == want);
}

TEST_CASE("embedding rejects ids outside the table, naming the id and its row", "[ops]") {
  Msgs m;
  F32 table({4, 2}), out({3, 2}, 7.0f), dtable({4, 2}, 7.0f);
  I32 ids({3});
  for (int32_t bad : {4, -1, 1 << 30}) {
    ids.v = {0, 3, bad};
    INFO("bad id " << bad);
    CHECK(ops().embedding_forward(m.ctx(), ids.dl(), table.dl(), out.dl(), 0) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("embedding_forward: id " + std::to_string(bad) +
                                  " at row 2 of ids int32[3] is outside [0, 4)"));
    CHECK(ops().embedding_backward(m.ctx(), ids.dl(), out.dl(), dtable.dl()) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("embedding_backward: id " + std::to_string(bad) + " at row 2"));
    // Checked before anything is written.
    for (float e : out.v) CHECK(e == 7.0f);
    for (float e : dtable.v) CHECK(e == 7.0f);
  }
}

TEST_CASE("embedding rejects bad shapes and dtypes", "[ops]") {
  Msgs m;
  F32 table({4, 2}), out({3, 2});
  I32 ids({3});
  SECTION("out rows != ids") {
    F32 out4({4, 2});
    CHECK(ops().embedding_forward(m.ctx(), ids.dl(), table.dl(), out4.dl(), 0) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("embedding_forward: out float32[4,2] must have one row per id"));
  }
  SECTION("width differs") {
    F32 out3({3, 3});
    CHECK(ops().embedding_forward(m.ctx(), ids.dl(), table.dl(), out3.dl(), 0) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(),
               Contains("the last dim of out float32[3,3] must be the last dim of table"));
  }
  SECTION("table not 2-D") {
    F32 t3({1, 4, 2});
    CHECK(ops().embedding_forward(m.ctx(), ids.dl(), t3.dl(), out.dl(), 0) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("table must be 2-D"));
  }
  SECTION("ids not int32") {
    Buf<int64_t> ids64({3}, DLDataType{kDLInt, 64, 1});
    CHECK(ops().embedding_forward(m.ctx(), ids64.dl(), table.dl(), out.dl(), 0) ==
          TSR_ERR_UNSUPPORTED);
    CHECK_THAT(m.last(), Contains("embedding_forward: ids must be int32"));
  }
  SECTION("accumulate flag") {
    CHECK(ops().embedding_forward(m.ctx(), ids.dl(), table.dl(), out.dl(), 2) == TSR_ERR_INVALID);
    CHECK_THAT(m.last(), Contains("accumulate must be 0 or 1"));
  }
}
