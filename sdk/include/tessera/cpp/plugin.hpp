// Header-only C++ helpers for writing tessera plugins: typed config reads,
// RAII for host memory, and a catch-all that turns every C++ exception into
// a status code at the ABI boundary. Nothing here crosses the boundary:
// plugins built with these helpers still export only the C ABI.
#pragma once

#include <tessera/tessera.h>

#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <tessera/cpp/error.hpp>
#include <tessera/cpp/struct_size.hpp>
#include <utility>
#include <vector>

namespace tessera::sdk {

// Runs `fn` and converts any exception into a status reported through the
// host's error callback. Use it around the body of every entry point.
template <typename Fn>
tsr_status guard(const tsr_host *host, Fn &&fn) noexcept {
  try {
    fn();
    return TSR_OK;
  } catch (const HostError &e) {
    return e.code();
  } catch (const Error &e) {
    return host ? host->error(host->ctx, e.code(), e.what()) : e.code();
  } catch (const std::bad_alloc &) {
    return host ? host->error(host->ctx, TSR_ERR_NO_MEMORY, "out of host memory")
                : TSR_ERR_NO_MEMORY;
  } catch (const std::exception &e) {
    std::string msg = std::string("unhandled exception: ") + e.what();
    return host ? host->error(host->ctx, TSR_ERR_INTERNAL, msg.c_str()) : TSR_ERR_INTERNAL;
  } catch (...) {
    return host ? host->error(host->ctx, TSR_ERR_INTERNAL, "unhandled non-standard exception")
                : TSR_ERR_INTERNAL;
  }
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

}  // namespace tessera::sdk
