// Tensor helpers for model plugins written on the ops table: a DLTensor view
// that owns its shape, the checked view of a parameter or gradient the host
// hands out for a step, the beta of a gradient's first contribution, the
// last copy of predict's logits into the caller's float32 tensor, and the
// check of a batch of token sequences.
// Header-only; the gpt2 and llama plugins use them.
#pragma once

#include <tessera/tessera.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <tessera/cpp/error.hpp>
#include <tessera/cpp/plugin.hpp>

namespace tessera::sdk {

inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

// "[2, 3]", for messages.
inline std::string shape_str(const int64_t *shape, int32_t ndim) {
  std::string s = "[";
  for (int32_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A view with up to 5 dims and optional strides that owns its shape; get()
// re-points the DLTensor at this object's arrays, so views copy freely.
class View {
 public:
  View() { std::memset(&t_, 0, sizeof t_); }
  View(void *data, size_t byte_offset, DLDevice device, DLDataType dtype,
       std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides = {}) {
    if (shape.size() > 5 || (strides.size() != 0 && strides.size() != shape.size()))
      throw Error(TSR_ERR_INTERNAL, "sdk::View: " + std::to_string(shape.size()) + " dims and " +
                                        std::to_string(strides.size()) +
                                        " strides; at most 5 dims, and a stride for each or none");
    std::memset(&t_, 0, sizeof t_);
    t_.data = data;
    t_.byte_offset = byte_offset;
    t_.device = device;
    t_.dtype = dtype;
    t_.ndim = static_cast<int32_t>(shape.size());
    std::copy(shape.begin(), shape.end(), shape_);
    strided_ = strides.size() != 0;
    std::copy(strides.begin(), strides.end(), strides_);
  }
  // The memory of `base` (a compact tensor) with another shape.
  View(const DLTensor &base, std::initializer_list<int64_t> shape)
      : View(base.data, base.byte_offset, base.device, base.dtype, shape) {}
  DLTensor *get() {
    t_.shape = shape_;
    t_.strides = strided_ ? strides_ : nullptr;
    return &t_;
  }

 private:
  DLTensor t_;
  int64_t shape_[5] = {0, 0, 0, 0, 0};
  int64_t strides_[5] = {0, 0, 0, 0, 0};
  bool strided_ = false;
};

// Parameter `index` (`p` its declaration) or its gradient as the host hands
// it out for `step`, checked to hold p's element count compactly (a model
// reshapes it with View, which assumes compact memory); `who` names the
// plugin in messages.
inline DLTensor step_tensor(const tsr_host *host, tsr_step *step, uint32_t index, bool grad,
                            const tsr_param_info &p, const char *who) {
  DLTensor t;
  std::memset(&t, 0, sizeof t);
  check(grad ? host->grad(step, index, &t) : host->param(step, index, &t));
  int64_t want = 1, got = 1;
  for (int32_t k = 0; k < p.ndim; ++k) want *= p.shape[k];
  for (int32_t k = 0; k < t.ndim; ++k) got *= t.shape ? t.shape[k] : -1;
  if (got != want)
    throw Error(TSR_ERR_INTERNAL, std::string(who) + ": the host's " +
                                      (grad ? "gradient" : "parameter") + " view of '" + p.name +
                                      "' has " + std::to_string(got) + " elements, expected " +
                                      std::to_string(want));
  if (t.strides) {
    int64_t expect = 1;
    for (int32_t k = t.ndim - 1; k >= 0; --k) {
      if (t.shape[k] != 1 && t.strides[k] != expect)
        throw Error(TSR_ERR_INTERNAL,
                    std::string(who) + ": the host's view of '" + p.name + "' is not compact");
      expect *= t.shape[k];
    }
  }
  return t;
}

// The beta of a gradient's first contribution in this backward: 0 where
// the host says every gradient buffer began the pass at zero (ABI 1.5; a
// weight-gradient matmul then writes instead of reading the old gradient,
// same values), else 1 (a later micro-batch, or a host that does not say).
inline float first_grad_beta(const tsr_host *host, tsr_step *step) {
  int32_t zeroed = 0;
  if (TSR_HAS_FIELD(host, tsr_host, grads_zeroed) && host->grads_zeroed)
    check(host->grads_zeroed(step, &zeroed));
  return zeroed ? 0.0f : 1.0f;
}

// predict's logits z ([rows, V], the model's compute dtype, on `device`)
// into the caller's float32 `out`: a copy when z is float32, a cast when
// out is on the model's device, else a cast into `scratch` (grown to
// `scratch_bytes` when smaller) and a copy across.
inline void logits_to_f32(const tsr_host *host, DLDevice device, DLTensor *z, DLTensor *out,
                          Buffer &scratch, size_t scratch_bytes) {
  const tsr_ops *ops = host->ops;
  const bool on_model =
      out->device.device_type == device.device_type && out->device.device_id == device.device_id;
  if (same_dtype(z->dtype, dtype_f32())) {
    check(ops->copy(host->ctx, z, out));
  } else if (on_model) {
    check(ops->cast(host->ctx, z, out));
  } else {
    int64_t n = 1;
    for (int32_t k = 0; k < z->ndim; ++k) n *= z->shape[k];
    if (scratch.bytes() < static_cast<size_t>(n) * 4)
      scratch = Buffer(host, device, std::max(scratch_bytes, static_cast<size_t>(n) * 4),
                       TSR_MEM_ACTIVATIONS);
    View zf(scratch.get(), 0, device, dtype_f32(), {z->shape[0], z->ndim > 1 ? z->shape[1] : 1});
    check(ops->cast(host->ctx, z, zf.get()));
    check(ops->copy(host->ctx, zf.get(), out));
  }
}

// A language model's batch of `batch->size` token sequences: inputs (and
// with `with_targets` targets) int32 [n, T], contiguous, on `device`, n at
// most `max_batch` and T from 1 to `max_len` (`len_key` names the model's
// key in the message). Returns T (0 for an empty batch); errors start with
// `who`. predict passes with_targets = false: its targets may be absent.
inline int64_t check_token_batch(const char *who, const tsr_batch *batch, bool with_targets,
                                 int64_t max_batch, DLDevice device, int64_t max_len,
                                 const char *len_key) {
  const std::string w = who;
  if (!batch) throw Error(TSR_ERR_INVALID, w + ": batch is NULL");
  const int64_t n = batch->size;
  if (n < 0 || n > max_batch)
    throw Error(TSR_ERR_INVALID, w + ": batch of " + std::to_string(n) +
                                     " sequences; the model was built for at most " +
                                     std::to_string(max_batch));
  if (n == 0) return 0;
  const DLTensor &x = batch->inputs, &y = batch->targets;
  for (const DLTensor *t : {&x, &y}) {
    if (t == &y && !with_targets) break;
    const std::string what = w + ": batch " + (t == &x ? "inputs" : "targets");
    if (!same_dtype(t->dtype, dtype_i32()))
      throw Error(TSR_ERR_INVALID, what + " must be int32 token ids, got " + dtype_name(t->dtype));
    if (t->ndim != 2 || !t->shape || t->shape[0] != n)
      throw Error(TSR_ERR_INVALID, what + " are " +
                                       (t->shape ? shape_str(t->shape, t->ndim) : "?") +
                                       ", expected [" + std::to_string(n) + ", T]");
    if (t->device.device_type != device.device_type || t->device.device_id != device.device_id)
      throw Error(TSR_ERR_INVALID, what + " are not on the model's device");
    if (t->strides && ((t->shape[1] != 1 && t->strides[1] != 1) ||
                       (t->shape[0] != 1 && t->strides[0] != t->shape[1])))
      throw Error(TSR_ERR_INVALID, what + " must be contiguous row-major");
  }
  const int64_t T = x.shape[1];
  if (with_targets && y.shape[1] != T)
    throw Error(TSR_ERR_INVALID, w + ": batch targets have " + std::to_string(y.shape[1]) +
                                     " tokens per sequence, inputs " + std::to_string(T));
  if (T < 1 || T > max_len)
    throw Error(TSR_ERR_INVALID, w + ": sequences of " + std::to_string(T) +
                                     " tokens; the model's " + len_key + " is " +
                                     std::to_string(max_len));
  return T;
}

}  // namespace tessera::sdk
