// Tensor helpers for model plugins written on the ops table: a DLTensor view
// that owns its shape, the checked view of a parameter or gradient the host
// hands out for a step, and the last copy of predict's logits into the
// caller's float32 tensor. Header-only; the gpt2 and llama plugins use them.
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

}  // namespace tessera::sdk
