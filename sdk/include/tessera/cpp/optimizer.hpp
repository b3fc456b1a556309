// Header-only helpers for optimizer plugins: argument checks shared by
// every step, the gradient readers (fp32, or bf16 / fp16 widened exactly),
// the low-precision compute copy (fp32 -> bf16 / fp16 with
// round-to-nearest-even, half.hpp) written in the same pass as the fp32
// master, and the vtable adapter (optimizer_vtable).
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <tessera/cpp/entries.hpp>
#include <tessera/cpp/half.hpp>
#include <tessera/cpp/plugin.hpp>

namespace tessera::sdk::optim {

// ---------------------------------------------------------------------------
// The gradients: fp32, or (ABI 1.1) bf16 / fp16 read as such and widened
// exactly before grad_scale is applied, so a 16-bit gradient gives the same
// update as the same values handed over in fp32.

enum class Elem { none, f32, bf16, f16 };

inline const char *elem_name(Elem e) {
  switch (e) {
    case Elem::f32:
      return "float32";
    case Elem::bf16:
      return "bfloat16";
    case Elem::f16:
      return "float16";
    default:
      return "none";
  }
}

struct GradsF32 {
  const float *g;
  float operator[](size_t i) const { return g[i]; }
  GradsF32 rebase(size_t off) const { return {g + off}; }
};
struct GradsBF16 {
  const uint16_t *g;
  float operator[](size_t i) const { return bf16_to_float(g[i]); }
  GradsBF16 rebase(size_t off) const { return {g + off}; }
};
struct GradsF16 {
  const uint16_t *g;
  float operator[](size_t i) const { return f16_to_float(g[i]); }
  GradsF16 rebase(size_t off) const { return {g + off}; }
};

// ---------------------------------------------------------------------------
// The compute copy: after the fp32 master is updated, the engine may want the
// same values in the compute dtype (what forward/backward read). Each writer
// is a tiny value type whose put() the kernel calls per element; rebase()
// moves it to a segment's first element.

struct NoCopy {
  void put(size_t, float) const {}
  NoCopy rebase(size_t) const { return *this; }
};
struct CopyF32 {
  float *out;
  void put(size_t i, float x) const { out[i] = x; }
  CopyF32 rebase(size_t off) const { return {out + off}; }
};
struct CopyBF16 {
  uint16_t *out;
  void put(size_t i, float x) const { out[i] = float_to_bf16(x); }
  CopyBF16 rebase(size_t off) const { return {out + off}; }
};
struct CopyF16 {
  uint16_t *out;
  void put(size_t i, float x) const { out[i] = float_to_f16(x); }
  CopyF16 rebase(size_t off) const { return {out + off}; }
};

// printf-style formatting into a std::string for error messages (snprintf
// rather than std::to_string keeps libstdc++ template symbols out of the
// library's dynamic symbol table).
[[gnu::format(printf, 1, 2)]] inline std::string fmt(const char *f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

inline bool dtype_is(DLDataType t, uint8_t code, uint8_t bits) {
  return t.code == code && t.bits == bits && t.lanes == 1;
}

inline std::string dtype_str(DLDataType t) {
  return fmt("code %u, bits %u, lanes %u", unsigned(t.code), unsigned(t.bits), unsigned(t.lanes));
}

// The compute copy's element type (Elem::none when compute_params is NULL);
// anything but float32, bfloat16 or float16 is TSR_ERR_UNSUPPORTED.
inline Elem compute_elem(const tsr_optimizer_step_args *args, const char *who) {
  if (!args->compute_params) return Elem::none;
  DLDataType t = args->compute_dtype;
  if (dtype_is(t, kDLFloat, 32)) return Elem::f32;
  if (dtype_is(t, kDLBfloat, 16)) return Elem::bf16;
  if (dtype_is(t, kDLFloat, 16)) return Elem::f16;
  throw Error(TSR_ERR_UNSUPPORTED,
              fmt("%s: compute copy dtype (%s) is not supported; use float32, bfloat16 or float16",
                  who, dtype_str(t).c_str()));
}

// The gradients' element type: args->grads_dtype where the caller's struct
// has the field (ABI 1.1), float32 otherwise. An all-zero dtype (a zeroed
// struct whose writer never set the field) also means float32: no real
// dtype has zero bits.
inline Elem grads_elem(const tsr_optimizer_step_args *args, const char *who) {
  if (!TSR_HAS_FIELD(args, tsr_optimizer_step_args, grads_dtype)) return Elem::f32;
  DLDataType t = args->grads_dtype;
  if (t.code == 0 && t.bits == 0 && t.lanes == 0) return Elem::f32;
  if (dtype_is(t, kDLFloat, 32)) return Elem::f32;
  if (dtype_is(t, kDLBfloat, 16)) return Elem::bf16;
  if (dtype_is(t, kDLFloat, 16)) return Elem::f16;
  throw Error(TSR_ERR_UNSUPPORTED,
              fmt("%s: gradient dtype (%s) is not supported; use float32, bfloat16 or float16", who,
                  dtype_str(t).c_str()));
}

// Calls fn(writer) with the writer of type `e` at `out` (Elem::none: the
// writer that writes nothing), so the kernels are instantiated once per
// output type and hold no branch on the dtype.
template <typename Fn>
void with_compute_copy(Elem e, void *out, Fn &&fn) {
  switch (e) {
    case Elem::f32:
      return fn(CopyF32{static_cast<float *>(out)});
    case Elem::bf16:
      return fn(CopyBF16{static_cast<uint16_t *>(out)});
    case Elem::f16:
      return fn(CopyF16{static_cast<uint16_t *>(out)});
    default:
      return fn(NoCopy{});
  }
}

// The same for args->compute_params in its dtype (see compute_elem).
template <typename Fn>
void with_compute_copy(const tsr_optimizer_step_args *args, const char *who, Fn &&fn) {
  with_compute_copy(compute_elem(args, who), args->compute_params, static_cast<Fn &&>(fn));
}

// Calls fn(reader) with the reader of type `e` at `g` (Elem::none reads
// float32), one instantiation per gradient type like with_compute_copy.
template <typename Fn>
void with_grads(Elem e, const void *g, Fn &&fn) {
  switch (e) {
    case Elem::bf16:
      return fn(GradsBF16{static_cast<const uint16_t *>(g)});
    case Elem::f16:
      return fn(GradsF16{static_cast<const uint16_t *>(g)});
    default:
      return fn(GradsF32{static_cast<const float *>(g)});
  }
}

// The same for args->grads in its dtype (see grads_elem).
// (args->grads is typed `const float *` since ABI 1.0; with a 16-bit
// grads_dtype it points at uint16_t bit patterns.)
template <typename Fn>
void with_grads(const tsr_optimizer_step_args *args, const char *who, Fn &&fn) {
  with_grads(grads_elem(args, who), args->grads, static_cast<Fn &&>(fn));
}

// Bytes of one element of type `e` (0 for Elem::none).
inline size_t elem_bytes(Elem e) {
  return e == Elem::f32 ? 4 : e == Elem::none ? 0 : 2;
}

// What a plugin's step can take beyond the defaults of check_step_args:
// which devices (TSR_DEVICE_* bits) and whether bf16 / fp16 gradients are
// read (with_grads). The defaults are what every plugin written before
// ABI 1.1 handles: CPU memory and fp32 gradients.
struct StepSupport {
  uint32_t devices = TSR_DEVICE_CPU;
  bool low_precision_grads = false;
};

// Checks what every step needs before touching memory: the struct version,
// the device, the gradient dtype, non-null arrays, and segments inside
// [0, n). The segment table is host memory whatever the device.
inline void check_step_args(const tsr_optimizer_step_args *args, uint32_t state_count,
                            const char *who, StepSupport support = {}) {
  // Every field up to compute_dtype is ABI 1.0; grads_dtype is read only
  // where TSR_HAS_FIELD says the caller's struct has it.
  if (!args || !TSR_HAS_FIELD(args, tsr_optimizer_step_args, compute_dtype))
    throw Error(TSR_ERR_INVALID, fmt("%s: step args missing or from an older ABI (struct_size %zu)",
                                     who, args ? args->struct_size : size_t(0)));
  const int32_t dev = args->device.device_type;
  const bool cpu = dev == kDLCPU && (support.devices & TSR_DEVICE_CPU);
  const bool cuda = dev == kDLCUDA && (support.devices & TSR_DEVICE_CUDA);
  if (!cpu && !cuda) {
    if (support.devices == TSR_DEVICE_CPU)
      throw Error(TSR_ERR_UNSUPPORTED,
                  fmt("%s: only the CPU step is implemented (device type %d given); run the "
                      "optimizer on CPU or use an offload plugin",
                      who, int(dev)));
    if (dev == kDLCUDA)
      throw Error(TSR_ERR_UNSUPPORTED,
                  fmt("%s: device type %d (CUDA) given, but this build of the plugin has no CUDA "
                      "kernels (it was built without the CUDA toolkit); only the CPU step is "
                      "available",
                      who, int(dev)));
    throw Error(TSR_ERR_UNSUPPORTED,
                fmt("%s: device type %d is not supported (CPU%s only)", who, int(dev),
                    (support.devices & TSR_DEVICE_CUDA) ? " and CUDA" : ""));
  }
  const Elem g = grads_elem(args, who);
  if (g != Elem::f32 && !support.low_precision_grads)
    throw Error(TSR_ERR_UNSUPPORTED,
                fmt("%s: gradients in %s are not supported; this optimizer reads float32 "
                    "gradients only",
                    who, elem_name(g)));
  if (args->step < 1)
    throw Error(TSR_ERR_INVALID,
                fmt("%s: step must count from 1, got %lld", who, (long long)args->step));
  if (args->n == 0) return;
  if (!args->params || !args->grads)
    throw Error(TSR_ERR_INVALID, fmt("%s: params and grads must not be NULL", who));
  if (state_count > 0 && !args->state)
    throw Error(TSR_ERR_INVALID, fmt("%s: state arrays must not be NULL", who));
  for (uint32_t s = 0; s < state_count; ++s)
    if (!args->state[s]) throw Error(TSR_ERR_INVALID, fmt("%s: state array %u is NULL", who, s));
  if (args->num_segments > 0 && !args->segments)
    throw Error(TSR_ERR_INVALID, fmt("%s: segments must not be NULL", who));
  for (size_t k = 0; k < args->num_segments; ++k) {
    const tsr_segment &s = args->segments[k];
    if (s.offset > args->n || s.count > args->n - s.offset)
      throw Error(TSR_ERR_INVALID, fmt("%s: segment %zu [%zu, %zu + %zu) lies outside [0, %zu)",
                                       who, k, s.offset, s.offset, s.count, args->n));
  }
}

}  // namespace tessera::sdk::optim

namespace tessera::sdk {

// An optimizer plugin's function table (tsr_optimizer_vtable) built from a
// C++ class, every entry guarded (entries.hpp):
//
//   struct MyOptimizer {
//     static constexpr const char *kName = "my_opt";  // for messages
//     const tsr_host *host;
//     uint32_t state_count() const;             // fp32 state arrays per element
//     const char *state_name(uint32_t i) const; // NULL past state_count
//     void step(const tsr_optimizer_step_args *args);
//   };
//   MyOptimizer *build(const tsr_host *, const tsr_config *);
//   const tsr_optimizer_vtable kVtable = sdk::optimizer_vtable<MyOptimizer, build>();
template <typename O>
struct OptimizerEntries {
  static uint32_t state_count(void *self) {
    return entries::value<O>(self, uint32_t{0}, [](O &o) { return o.state_count(); });
  }
  static const char *state_name(void *self, uint32_t i) {
    return entries::value<O>(self, static_cast<const char *>(nullptr),
                             [&](O &o) { return o.state_name(i); });
  }
};

template <typename O, auto Build>
constexpr tsr_optimizer_vtable optimizer_vtable() {
  using E = OptimizerEntries<O>;
  return tsr_optimizer_vtable{tsr_optimizer_vtable_STRUCT_SIZE,
                              &entries::create_from<O, Build>,
                              &entries::destroy<O>,
                              &E::state_count,
                              &E::state_name,
                              entries::member<O, &O::step>};
}

}  // namespace tessera::sdk
