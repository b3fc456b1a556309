// cuDNN 9, loaded at run time. The engine does not link libcudnn: it
// dlopen()s libcudnn.so.9 on first use and resolves the dozen entry points of
// the backend (graph) API it needs. A machine without cuDNN, or with a cuDNN
// too old, then still runs everything on the engine's own kernels; the build
// needs only cuDNN's headers (cudnn_graph.h), for the types and enum values.
//
// Only compiled with TESSERA_HAVE_CUDNN (the headers were found at configure
// time); nothing outside engine/backend/cuda/cudnn_*.cpp and attention_cudnn.cpp
// includes this file, so no other translation unit depends on the headers.
#pragma once

#include <cudnn_graph.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace tessera::cuda::cudnn {

// The resolved entry points. The types come from the header's declarations
// (decltype does not reference the symbols, so nothing is linked).
struct Lib {
  size_t version = 0;  // cudnnGetVersion(): 91900 for 9.19.0
  std::string path;    // the name dlopen() took
  decltype(&::cudnnGetVersion) get_version = nullptr;
  decltype(&::cudnnGetErrorString) error_string = nullptr;
  decltype(&::cudnnGetLastErrorString) last_error = nullptr;  // optional
  decltype(&::cudnnCreate) create = nullptr;
  decltype(&::cudnnSetStream) set_stream = nullptr;
  decltype(&::cudnnBackendCreateDescriptor) create_desc = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) destroy_desc = nullptr;
  decltype(&::cudnnBackendSetAttribute) set_attr = nullptr;
  decltype(&::cudnnBackendGetAttribute) get_attr = nullptr;
  decltype(&::cudnnBackendFinalize) finalize = nullptr;
  decltype(&::cudnnBackendExecute) execute = nullptr;
};

// The library, loaded once per process; nullptr when it cannot be loaded or
// is older than 9.0, with the reason in *why.
const Lib *lib(std::string *why);

// "9.19.0" for 91900.
std::string version_string(size_t v);

// Throws tessera::Error(TSR_ERR_UNSUPPORTED) naming `what`, the status and
// cuDNN's last error message, unless s is CUDNN_STATUS_SUCCESS.
void check(const Lib &l, cudnnStatus_t s, const char *what);

// The cuDNN handle of the selected device, created on first use and bound
// to the engine's compute stream (re-bound on every call: cheap, and it
// keeps the handle right if the stream were ever replaced).
cudnnHandle_t handle(const Lib &l);

// One backend descriptor, destroyed with the object.
class Desc {
 public:
  Desc(const Lib &l, cudnnBackendDescriptorType_t type, const char *what);
  ~Desc();
  Desc(Desc &&o) noexcept : l_(o.l_), d_(std::exchange(o.d_, nullptr)), what_(o.what_) {}
  Desc &operator=(Desc &&) = delete;
  Desc(const Desc &) = delete;
  Desc &operator=(const Desc &) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void *values);
  template <typename T>
  void set1(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T &value) {
    set(name, type, 1, &value);
  }
  // Another descriptor as the attribute's value.
  void set_desc(cudnnBackendAttributeName_t name, const Desc &value) {
    const cudnnBackendDescriptor_t v = value.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  void finalize();

 private:
  const Lib *l_;
  cudnnBackendDescriptor_t d_ = nullptr;
  const char *what_;
};

}  // namespace tessera::cuda::cudnn
