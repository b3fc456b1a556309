#include "train/device_select.hpp"

#include <cstdlib>

#include "util/error.hpp"
#ifdef TESSERA_HAVE_CUDA
#include "backend/cuda/device.hpp"
#endif

namespace tessera {

namespace {

int gpus_visible() {
#ifdef TESSERA_HAVE_CUDA
  return cuda::visible_devices();
#else
  return 0;
#endif
}

std::string visible_env() {
  const char *v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? std::string(" (CUDA_VISIBLE_DEVICES=\"") + v + "\")" : std::string();
}

}  // namespace

DLDevice choose_device(const config::Settings &st, uint32_t local_rank, uint32_t local_world) {
  bool cuda = false;
  if (st.device == "cuda") {
#ifndef TESSERA_HAVE_CUDA
    throw Error(TSR_ERR_UNSUPPORTED,
                "run.device = \"cuda\": this tessera was built without CUDA (the toolkit was not "
                "found at build time); use \"cpu\" or \"auto\"");
#endif
    if (gpus_visible() == 0)
      throw Error(TSR_ERR_UNSUPPORTED, "run.device = \"cuda\": no GPU is visible to this process" +
                                           visible_env() + "; use \"cpu\" or \"auto\"");
    cuda = true;
  } else if (st.device == "auto") {
    cuda = gpus_visible() > 0;
  }
  if (!cuda) {
    if (st.precision != "fp32")
      throw Error(TSR_ERR_CONFIG,
                  "run.precision = \"" + st.precision +
                      "\": CPU runs compute in fp32 (bf16 and fp16 need a GPU; none is used here: "
                      "run.device = \"" +
                      st.device + "\")");
    return DLDevice{kDLCPU, 0};
  }
#ifdef TESSERA_HAVE_CUDA
  const int n = gpus_visible();
  if (local_world > static_cast<uint32_t>(n))
    throw Error(TSR_ERR_CONFIG, std::to_string(local_world) + " ranks on this host but only " +
                                    std::to_string(n) + " GPU" + (n == 1 ? "" : "s") + " visible" +
                                    visible_env() +
                                    ": one rank per GPU (lower -n, or set run.device = \"cpu\")");
  const int ordinal = static_cast<int>(local_rank % static_cast<uint32_t>(n));
  cuda::select_device(ordinal);
  return DLDevice{kDLCUDA, ordinal};
#else
  (void)local_rank;
  (void)local_world;
  return DLDevice{kDLCPU, 0};
#endif
}

std::string describe_device(DLDevice d) {
  if (d.device_type != kDLCUDA) return "cpu";
  std::string s = "cuda:" + std::to_string(d.device_id);
#ifdef TESSERA_HAVE_CUDA
  s += " (";
  s += cuda::device_name();
  s += ")";
#endif
  return s;
}

}  // namespace tessera
