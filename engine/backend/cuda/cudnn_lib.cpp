// cuDNN loaded at run time (see cudnn_lib.hpp for why dlopen rather than a
// link dependency).
#if TESSERA_HAVE_CUDNN

#include "backend/cuda/cudnn_lib.hpp"

#include <dlfcn.h>

#include <mutex>
#include <unordered_map>

#include "backend/cuda/device.hpp"
#include "util/error.hpp"

namespace tessera::cuda::cudnn {

namespace {

// libcudnn.so.9 is the small front library that loads cuDNN's sub-libraries
// on demand; libcudnn_graph.so.9 holds the backend API itself and serves
// when only the graph library was installed.
constexpr const char *kNames[] = {"libcudnn.so.9", "libcudnn_graph.so.9"};

template <typename F>
bool resolve(void *so, const char *name, F &fn, std::string *missing) {
  fn = reinterpret_cast<F>(dlsym(so, name));
  if (!fn && missing->empty()) *missing = name;
  return fn != nullptr;
}

struct Loaded {
  Lib lib;
  bool ok = false;
  std::string why;
};

Loaded load() {
  Loaded r;
  void *so = nullptr;
  std::string errors;
  for (const char *n : kNames) {
    so = dlopen(n, RTLD_NOW | RTLD_LOCAL);
    if (so) {
      r.lib.path = n;
      break;
    }
    const char *e = dlerror();
    errors += std::string(errors.empty() ? "" : "; ") + (e ? e : n);
  }
  if (!so) {
    r.why = "cuDNN 9 not found (" + errors + ")";
    return r;
  }
  Lib &l = r.lib;
  std::string missing;
  resolve(so, "cudnnGetVersion", l.get_version, &missing);
  resolve(so, "cudnnGetErrorString", l.error_string, &missing);
  resolve(so, "cudnnCreate", l.create, &missing);
  resolve(so, "cudnnSetStream", l.set_stream, &missing);
  resolve(so, "cudnnBackendCreateDescriptor", l.create_desc, &missing);
  resolve(so, "cudnnBackendDestroyDescriptor", l.destroy_desc, &missing);
  resolve(so, "cudnnBackendSetAttribute", l.set_attr, &missing);
  resolve(so, "cudnnBackendGetAttribute", l.get_attr, &missing);
  resolve(so, "cudnnBackendFinalize", l.finalize, &missing);
  resolve(so, "cudnnBackendExecute", l.execute, &missing);
  if (!missing.empty()) {
    r.why = r.lib.path + " lacks " + missing;
    return r;  // the library stays loaded: harmless, and dlclose of cuDNN is not safe to rely on
  }
  std::string unused;
  resolve(so, "cudnnGetLastErrorString", l.last_error, &unused);
  l.version = l.get_version();
  if (l.version < 90000) {
    r.why =
        r.lib.path + " is cuDNN " + version_string(l.version) + "; the engine needs 9.0 or newer";
    return r;
  }
  r.ok = true;
  return r;
}

}  // namespace

const Lib *lib(std::string *why) {
  static const Loaded *loaded = new Loaded(load());  // never destroyed: cuDNN may outlive statics
  if (!loaded->ok) {
    if (why) *why = loaded->why;
    return nullptr;
  }
  return &loaded->lib;
}

std::string version_string(size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

void check(const Lib &l, cudnnStatus_t s, const char *what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  std::string msg = std::string(what) + ": " + l.error_string(s);
  if (l.last_error) {
    char buf[1024] = {};
    l.last_error(buf, sizeof buf);
    if (buf[0]) msg += std::string(" (") + buf + ")";
  }
  throw Error(TSR_ERR_UNSUPPORTED, msg);
}

cudnnHandle_t handle(const Lib &l) {
  // One process drives one GPU, but key by device anyway: a handle belongs
  // to the device that was current when it was made.
  static std::mutex mu;
  static auto *handles = new std::unordered_map<int, cudnnHandle_t>;
  std::lock_guard<std::mutex> lock(mu);
  bind_thread();
  const int dev = current_device();
  auto it = handles->find(dev);
  if (it == handles->end()) {
    cudnnHandle_t h = nullptr;
    check(l, l.create(&h), "cudnnCreate");
    it = handles->emplace(dev, h).first;
  }
  check(l, l.set_stream(it->second, compute_stream()), "cudnnSetStream");
  return it->second;
}

Desc::Desc(const Lib &l, cudnnBackendDescriptorType_t type, const char *what)
    : l_(&l), what_(what) {
  check(l, l.create_desc(type, &d_), what);
}

Desc::~Desc() {
  if (d_) l_->destroy_desc(d_);
}

void Desc::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
               const void *values) {
  const cudnnStatus_t s = l_->set_attr(d_, name, type, count, values);
  if (s != CUDNN_STATUS_SUCCESS) {
    const std::string w = std::string(what_) + ": attribute " + std::to_string(name);
    check(*l_, s, w.c_str());
  }
}

void Desc::finalize() {
  const std::string w = std::string(what_) + ": finalize";
  check(*l_, l_->finalize(d_), w.c_str());
}

}  // namespace tessera::cuda::cudnn

#endif  // TESSERA_HAVE_CUDNN
