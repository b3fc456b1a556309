// One live plugin instance of any kind, as the session holds it.
#pragma once

#include <string>

#include "plugin/caps.hpp"

namespace tessera {

template <typename VTable>
struct Instance {
  const VTable *vt = nullptr;
  void *self = nullptr;
  std::string name;
  // What it offers beyond its kind's 1.0 table, resolved when its library
  // loaded (plugin/caps.hpp).
  PluginCaps caps;
  Instance() = default;
  Instance(const Instance &) = delete;
  Instance &operator=(const Instance &) = delete;
  ~Instance() { reset(); }
  void reset() {
    if (vt && self) vt->destroy(self);
    self = nullptr;
  }
};

}  // namespace tessera
