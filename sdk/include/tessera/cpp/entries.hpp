// What every kind's vtable adapter (model.hpp, dataset.hpp, sampler.hpp,
// optimizer.hpp, offload.hpp, zero.hpp) shares: create and destroy over a
// plugin's C++ class, and a guarded call of one of its members. A plugin
// class T has
//
//   static constexpr const char *kName = "my_plugin";  // for messages
//   const tsr_host *host;                 // or a member function host()
//
// and a build function (per kind) that returns a new T, as T * or
// std::unique_ptr<T>. Every entry turns an exception into a status through
// the host's error callback (guard), and a NULL self into TSR_ERR_INVALID.
#pragma once

#include <tessera/tessera.h>

#include <memory>
#include <string>
#include <tessera/cpp/plugin.hpp>

namespace tessera::sdk::entries {

template <typename T>
const tsr_host *host_of(const T &t) {
  if constexpr (requires { t.host(); })
    return t.host();
  else
    return t.host;
}

template <typename T>
T *owned(T *p) {
  return p;
}
template <typename T, typename D>
T *owned(std::unique_ptr<T, D> p) {
  return p.release();
}

// create: *out_self is NULL unless make() succeeds.
template <typename T, typename Make>
tsr_status create(const tsr_host *host, void **out_self, Make &&make) noexcept {
  if (out_self) *out_self = nullptr;
  return guard(host, [&] {
    if (!out_self) throw Error(TSR_ERR_INVALID, std::string(T::kName) + ": out_self is NULL");
    *out_self = owned(make());
  });
}

template <typename T>
void destroy(void *self) noexcept {
  T *t = static_cast<T *>(self);
  if (!t) return;
  const tsr_host *host = host_of(*t);
  (void)guard(host, [&] { delete t; });
}

// fn(T &) under guard; a NULL self is TSR_ERR_INVALID.
template <typename T, typename Fn>
tsr_status call(void *self, Fn &&fn) noexcept {
  T *t = static_cast<T *>(self);
  if (!t) return TSR_ERR_INVALID;
  return guard(host_of(*t), [&] { fn(*t); });
}

// The value fn(T &) returns under guard, `fallback` for a NULL self or a
// failure (reported to the host): for entries that return a value.
template <typename T, typename R, typename Fn>
R value(void *self, R fallback, Fn &&fn) noexcept {
  T *t = static_cast<T *>(self);
  if (!t) return fallback;
  R r = fallback;
  (void)guard(host_of(*t), [&] { r = fn(*t); });
  return r;
}

// A pointer that must not be NULL, for entries that write through it.
template <typename T, typename P>
P *required(P *p, const char *what) {
  if (!p) throw Error(TSR_ERR_INVALID, std::string(T::kName) + ": " + what + " is NULL");
  return p;
}

// A void member function of T as a guarded C entry taking `void *self`
// first: for extension tables (extensions.h) whose entries mirror a member,
// e.g. `const tsr_ext_zero_grad_sink kSink = {..., entries::member<&Z::use_sink>};`.
template <auto F>
struct Member;
template <typename T, typename... A, void (T::*F)(A...)>
struct Member<F> {
  static tsr_status call(void *self, A... a) noexcept {
    return entries::call<T>(self, [&](T &t) { (t.*F)(a...); });
  }
};
template <auto F>
inline constexpr auto member = &Member<F>::call;

}  // namespace tessera::sdk::entries
