// Header-only C++ helpers for writing tessera plugins: typed config reads,
// RAII for host memory, a catch-all that turns every C++ exception into a
// status code at the ABI boundary, and the descriptor and library tables
// with the entry point. Nothing here crosses the boundary: plugins built
// with these helpers still export only the C ABI.
#pragma once

#include <tessera/tessera.h>

#include <cstring>
#include <exception>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <tessera/cpp/error.hpp>
#include <tessera/cpp/struct_size.hpp>
#include <utility>
#include <vector>

namespace tessera::sdk {

// Runs `fn` and converts any exception into a status reported through the
// host's error callback (without a host: the status alone). Use it around
// the body of every entry point.
template <typename Fn>
tsr_status guard(const tsr_host *host, Fn &&fn) noexcept {
  return guard_with(
      [host](tsr_status code, const char *message) {
        return host ? host->error(host->ctx, code, message) : code;
      },
      GuardWords{"unhandled exception: ", "unhandled non-standard exception"},
      std::forward<Fn>(fn));
}

// Typed reads of a plugin's config section; a failure throws HostError.
class Config {
 public:
  Config(const tsr_host *host, const tsr_config *cfg) : host_(host), cfg_(cfg) {}

  bool get_bool(const char *key) const {
    int32_t v = 0;
    check(host_->config_bool(cfg_, key, &v));
    return v != 0;
  }
  int64_t get_int(const char *key) const {
    int64_t v = 0;
    check(host_->config_int(cfg_, key, &v));
    return v;
  }
  double get_float(const char *key) const {
    double v = 0;
    check(host_->config_float(cfg_, key, &v));
    return v;
  }
  std::string get_string(const char *key) const {
    const char *v = nullptr;
    check(host_->config_string(cfg_, key, &v));
    return v ? v : "";
  }
  std::vector<int64_t> get_int_array(const char *key) const {
    size_t n = 0;
    check(host_->config_array_size(cfg_, key, &n));
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i) check(host_->config_int_at(cfg_, key, i, &out[i]));
    return out;
  }
  std::vector<double> get_float_array(const char *key) const {
    size_t n = 0;
    check(host_->config_array_size(cfg_, key, &n));
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) check(host_->config_float_at(cfg_, key, i, &out[i]));
    return out;
  }
  std::vector<std::string> get_string_array(const char *key) const {
    size_t n = 0;
    check(host_->config_array_size(cfg_, key, &n));
    std::vector<std::string> out(n);
    for (size_t i = 0; i < n; ++i) {
      const char *v = nullptr;
      check(host_->config_string_at(cfg_, key, i, &v));
      out[i] = v ? v : "";
    }
    return out;
  }

 private:
  const tsr_host *host_;
  const tsr_config *cfg_;
};

// Host memory owned by a plugin, freed on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const tsr_host *host, DLDevice device, size_t bytes, tsr_mem_purpose purpose)
      : host_(host) {
    check(host->alloc(host->ctx, device, bytes, purpose, &ptr_));
    bytes_ = bytes;
  }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  Buffer(Buffer &&o) noexcept { *this = std::move(o); }
  Buffer &operator=(Buffer &&o) noexcept {
    if (this != &o) {
      reset();
      host_ = std::exchange(o.host_, nullptr);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~Buffer() { reset(); }
  void reset() {
    if (host_ && ptr_) host_->free(host_->ctx, ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void *get() const { return ptr_; }
  template <typename T>
  T *as() const {
    return static_cast<T *>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  const tsr_host *host_ = nullptr;
  void *ptr_ = nullptr;
  size_t bytes_ = 0;
};

inline DLDataType dtype_f32() {
  return DLDataType{kDLFloat, 32, 1};
}
inline DLDataType dtype_i32() {
  return DLDataType{kDLInt, 32, 1};
}

// A dtype's name for messages ("float32", "bfloat16", "int32x4"), as a user
// reads it. (optim::dtype_str spells out code, bits and lanes instead.)
inline std::string dtype_name(DLDataType t) {
  const char *base = t.code == kDLFloat    ? "float"
                     : t.code == kDLInt    ? "int"
                     : t.code == kDLUInt   ? "uint"
                     : t.code == kDLBfloat ? "bfloat"
                                           : "dtype?_";
  std::string s = base + std::to_string(t.bits);
  if (t.lanes != 1) {  // in steps: GCC 12 misreads "x" + std::string here (-Wrestrict)
    s += "x";
    s += std::to_string(t.lanes);
  }
  return s;
}

// A contiguous DLTensor view over `data`. `shape` must outlive the view.
inline DLTensor view(void *data, DLDevice device, DLDataType dtype, int32_t ndim, int64_t *shape) {
  DLTensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.device = device;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

inline int64_t numel(const DLTensor &t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// A zeroed struct whose struct_size says which fields this build knows.
template <typename T>
T make() {
  T t;
  std::memset(&t, 0, sizeof t);
  t.struct_size = struct_size_v<T>;
  return t;
}

// Declared-parameter shorthands for descriptor tables.
constexpr tsr_param_decl param(const char *name, tsr_param_type type, const char *def,
                               const char *doc) {
  return tsr_param_decl{sizeof(tsr_param_decl), name, type, def, doc, 0, 0.0, 0, 0.0, nullptr};
}
constexpr tsr_param_decl param_range(const char *name, tsr_param_type type, const char *def,
                                     const char *doc, double lo, double hi) {
  return tsr_param_decl{sizeof(tsr_param_decl), name, type, def, doc, 1, lo, 1, hi, nullptr};
}
constexpr tsr_param_decl param_min(const char *name, tsr_param_type type, const char *def,
                                   const char *doc, double lo) {
  return tsr_param_decl{sizeof(tsr_param_decl), name, type, def, doc, 1, lo, 0, 0.0, nullptr};
}
constexpr tsr_param_decl param_choice(const char *name, const char *def, const char *doc,
                                      const char *choices) {
  return tsr_param_decl{
      sizeof(tsr_param_decl), name, TSR_PARAM_STRING, def, doc, 0, 0.0, 0, 0.0, choices};
}
// A number from lo to hi or one of the words of `choices`, whose '#' item
// says that a number is taken ("auto|#"): the user writes `ratio = 0.5` or
// `ratio = "auto"`, and the plugin reads either as a string ("0.5").
constexpr tsr_param_decl param_number_or(const char *name, const char *def, const char *doc,
                                         double lo, double hi, const char *choices) {
  return tsr_param_decl{
      sizeof(tsr_param_decl), name, TSR_PARAM_STRING, def, doc, 1, lo, 1, hi, choices};
}

// A plugin's descriptor, from what differs between plugins; the struct's
// size is this build's. `params` may be empty ({}: no config keys), and a
// null get_extension offers no extension (ABI 1.2).
constexpr tsr_plugin_descriptor describe(const char *kind, const char *name, const char *version,
                                         const char *summary,
                                         std::span<const tsr_param_decl> params, uint32_t devices,
                                         const void *vtable,
                                         const void *(*get_extension)(const char *id) = nullptr) {
  return tsr_plugin_descriptor{tsr_plugin_descriptor_STRUCT_SIZE,
                               kind,
                               name,
                               version,
                               summary,
                               params.data(),
                               params.size(),
                               devices,
                               vtable,
                               get_extension};
}

// The library table over `plugins`, declaring the ABI version of these
// headers.
template <size_t N>
constexpr tsr_plugin_library library(const tsr_plugin_descriptor *const (&plugins)[N]) {
  return tsr_plugin_library{tsr_plugin_library_STRUCT_SIZE, TSR_ABI_MAJOR, TSR_ABI_MINOR, plugins,
                            N};
}

}  // namespace tessera::sdk

// Defines the library's one exported symbol (TSR_PLUGIN_ENTRY) over the
// given descriptors (pointers to objects of static storage), at namespace
// scope. The tables are function-local statics with constant initializers:
// built at load time, before any call, and alive as long as the library.
#define TSR_SDK_PLUGIN_LIBRARY(...)                                                             \
  TSR_PLUGIN_ENTRY {                                                                            \
    static const tsr_plugin_descriptor *const tsr_sdk_plugins[] = {__VA_ARGS__};                \
    static const tsr_plugin_library tsr_sdk_library = ::tessera::sdk::library(tsr_sdk_plugins); \
    return &tsr_sdk_library;                                                                    \
  }
