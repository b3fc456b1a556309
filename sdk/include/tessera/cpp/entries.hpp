// What every kind's vtable adapter (model.hpp, dataset.hpp, sampler.hpp,
// optimizer.hpp, offload.hpp, zero.hpp) shares: create and destroy over a
// plugin's C++ class, and a guarded call of one of its members. A plugin
// class T has
//
//   static constexpr const char *kName = "my_plugin";  // for messages
//   const tsr_host *host;                 // or a member function host()
//
// and a build function (per kind) that returns a new T, as T * or
// std::unique_ptr<T>; an entry that mirrors a member (the C arguments less
// self, nothing returned) calls it as it stands (member below), the others
// adapt results and flags. Every entry turns an exception into a status
// through the host's error callback (guard), and a NULL self into
// TSR_ERR_INVALID.
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

// A kind's create entry: Build(host, cfg, a...) with what the kind passes
// besides the config (A: a dataset's split, a model's init; none for the
// other kinds), e.g. &create_from<D, build, const char *>.
template <typename T, auto Build, typename... A>
tsr_status create_from(const tsr_host *host, const tsr_config *cfg, A... a,
                       void **out_self) noexcept {
  return create<T>(host, out_self, [&] { return Build(host, cfg, a...); });
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

// A void member function F of T (or of a base of T) as a guarded C entry
// taking `void *self` first and F's arguments: for the entries that mirror
// a member exactly, in the adapters and in extension tables (extensions.h),
// e.g. `{..., entries::member<Z, &Z::use_sink>}`.
template <typename T, typename Fn, Fn F>
struct MemberFn;
template <typename T, typename C, typename... A, void (C::*F)(A...)>
struct MemberFn<T, void (C::*)(A...), F> {
  static tsr_status call(void *self, A... a) noexcept {
    return entries::call<T>(self, [&](T &t) {
      C &c = t;  // F may be a member of T's base C
      (c.*F)(a...);
    });
  }
};
template <typename T, typename C, typename... A, void (C::*F)(A...) const>
struct MemberFn<T, void (C::*)(A...) const, F> {
  static tsr_status call(void *self, A... a) noexcept {
    return entries::call<T>(self, [&](T &t) {
      const C &c = t;
      (c.*F)(a...);
    });
  }
};
template <typename T, auto F>
inline constexpr auto member = &MemberFn<T, decltype(F), F>::call;

}  // namespace tessera::sdk::entries
