#include "util/dltensor.hpp"

#include <cmath>
#include <numbers>

#include "util/error.hpp"

namespace tessera {

namespace {

std::string dl_dtype_name(DLDataType t) {
  std::string s;
  switch (t.code) {
    case kDLFloat:
      s = "float";
      break;
    case kDLInt:
      s = "int";
      break;
    case kDLUInt:
      s = "uint";
      break;
    case kDLBfloat:
      s = "bfloat";
      break;
    default:
      s = "dtype";
      s += std::to_string(t.code);
      s += "_";
      break;
  }
  s += std::to_string(t.bits);
  if (t.lanes != 1) {
    // Appended piecewise: "x" + to_string(...) trips a GCC 12 -Wrestrict false positive.
    s += "x";
    s += std::to_string(t.lanes);
  }
  return s;
}

std::string dl_dims_str(int ndim, const int64_t *dims) {
  std::string s = "[";
  for (int i = 0; i < ndim; i++) {
    if (i) s += ",";
    s += dims ? std::to_string(dims[i]) : "?";
  }
  return s + "]";
}

}  // namespace

std::string describe(const DLTensor *t) {
  if (!t) return "NULL";
  return dl_dtype_name(t->dtype) + dl_dims_str(t->ndim, t->shape);
}

void check_activation(const char *op, tsr_activation act) {
  TSR_CHECK(
      act == TSR_ACT_NONE || act == TSR_ACT_RELU || act == TSR_ACT_GELU || act == TSR_ACT_TANH,
      TSR_ERR_INVALID, std::string(op) + ": unknown activation " + std::to_string(act));
}

std::vector<double> rope_inv_freq(const char *op, const tsr_rope_params *p, int64_t head_dim) {
  const std::string w = std::string(op) + ": ";
  TSR_CHECK(p != nullptr, TSR_ERR_INVALID, w + "rope parameters are NULL");
  TSR_CHECK(TSR_HAS_FIELD(p, tsr_rope_params, original_max_position_embeddings), TSR_ERR_INVALID,
            w + "tsr_rope_params.struct_size " + std::to_string(p->struct_size) +
                " is smaller than the ABI 1.6 struct");
  TSR_CHECK(head_dim > 0 && head_dim % 2 == 0, TSR_ERR_INVALID,
            w + "head dim " + std::to_string(head_dim) + " must be even and positive");
  TSR_CHECK(p->type == TSR_ROPE_DEFAULT || p->type == TSR_ROPE_LLAMA3, TSR_ERR_INVALID,
            w + "unknown rope type " + std::to_string(p->type) +
                " (TSR_ROPE_DEFAULT = 0, TSR_ROPE_LLAMA3 = 1)");
  TSR_CHECK(std::isfinite(p->theta) && p->theta > 1.0, TSR_ERR_INVALID,
            w + "rope theta must be finite and > 1, got " + std::to_string(p->theta));
  const int64_t half = head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; i++)
    f[i] = 1.0 / std::pow(p->theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  if (p->type == TSR_ROPE_DEFAULT) return f;
  const double factor = p->factor, lo = p->low_freq_factor, hi = p->high_freq_factor;
  const double ctx = static_cast<double>(p->original_max_position_embeddings);
  TSR_CHECK(std::isfinite(factor) && factor > 0.0, TSR_ERR_INVALID,
            w + "llama3 rope factor must be > 0, got " + std::to_string(factor));
  TSR_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo > 0.0 && hi > lo, TSR_ERR_INVALID,
            w + "llama3 rope needs 0 < low_freq_factor < high_freq_factor, got " +
                std::to_string(lo) + " and " + std::to_string(hi));
  TSR_CHECK(p->original_max_position_embeddings > 0, TSR_ERR_INVALID,
            w + "llama3 rope original_max_position_embeddings must be > 0, got " +
                std::to_string(p->original_max_position_embeddings));
  // Wavelengths shorter than ctx / hi keep their frequency, longer than
  // ctx / lo are slowed by `factor`, and those between blend the two.
  const double long_wave = ctx / lo, short_wave = ctx / hi;
  for (double &v : f) {
    const double wavelen = 2.0 * std::numbers::pi / v;
    if (wavelen > long_wave) {
      v /= factor;
    } else if (wavelen >= short_wave) {
      const double s = (ctx / wavelen - lo) / (hi - lo);
      v = (1.0 - s) * v / factor + s * v;
    }
  }
  return f;
}

void check_dropout_args(const char *op, float p, float beta) {
  TSR_CHECK(std::isfinite(p) && p >= 0.0f && p < 1.0f, TSR_ERR_INVALID,
            std::string(op) + ": p must lie in [0, 1), got " + std::to_string(p));
  TSR_CHECK(std::isfinite(beta), TSR_ERR_INVALID,
            std::string(op) + ": beta must be finite, got " + std::to_string(beta));
}

void check_lowrank_shapes(const char *op, const DLTensor *a, const DLTensor *b, const DLTensor *y) {
  const std::string w = std::string(op) + ": ";
  TSR_CHECK(a && b && y, TSR_ERR_INVALID, w + "a, b and y must not be NULL");
  TSR_CHECK(a->ndim == 2 && b->ndim == 2 && y->ndim == 2, TSR_ERR_INVALID,
            w + "a, b and y must be 2-D, got a " + describe(a) + ", b " + describe(b) + ", y " +
                describe(y));
  const int64_t M = a->shape[0], r = a->shape[1], N = b->shape[1];
  TSR_CHECK(b->shape[0] == r && y->shape[0] == M && y->shape[1] == N, TSR_ERR_INVALID,
            w + "expected a [M, r], b [r, N], y [M, N], got a " + describe(a) + ", b " +
                describe(b) + ", y " + describe(y));
  TSR_CHECK(r >= 1 && r <= kLowrankMaxRank, TSR_ERR_INVALID,
            w + "the rank r (a's columns, b's rows) must lie in [1, " +
                std::to_string(kLowrankMaxRank) + "], got " + describe(a));
}

namespace {

// [first, last) byte addresses of t's elements (negative strides
// included); first == last when empty.
std::pair<uintptr_t, uintptr_t> byte_span(const DLTensor *t) {
  const intptr_t base =
      static_cast<intptr_t>(reinterpret_cast<uintptr_t>(t->data) + t->byte_offset);
  int64_t lo = 0, hi = 0;  // the smallest and largest element offsets
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] == 0) return {static_cast<uintptr_t>(base), static_cast<uintptr_t>(base)};
    int64_t stride = 1;
    if (t->strides) {
      stride = t->strides[d];
    } else {
      for (int e = d + 1; e < t->ndim; ++e) stride *= t->shape[e];
    }
    (stride < 0 ? lo : hi) += (t->shape[d] - 1) * stride;
  }
  const int64_t es = (static_cast<int64_t>(t->dtype.bits) * t->dtype.lanes + 7) / 8;
  return {static_cast<uintptr_t>(base + lo * es), static_cast<uintptr_t>(base + (hi + 1) * es)};
}

}  // namespace

void check_apart(const char *op, const char *out_name, const DLTensor *out,
                 std::initializer_list<std::pair<const char *, const DLTensor *>> inputs) {
  if (!out) return;
  const auto [olo, ohi] = byte_span(out);
  if (olo == ohi) return;
  for (const auto &[name, t] : inputs) {
    if (!t) continue;
    const auto [lo, hi] = byte_span(t);
    TSR_CHECK(lo == hi || ohi <= lo || hi <= olo, TSR_ERR_INVALID,
              std::string(op) + ": " + out_name + " " + describe(out) + " overlaps " + name + " " +
                  describe(t) + " in memory: give " + out_name + " a buffer of its own");
  }
}

}  // namespace tessera
