// The size a writer declares for each ABI struct (tsr_<type>_STRUCT_SIZE,
// from its last field: no tail padding claimed), for C++ code that fills
// structs generically, and copy_out for a callee that fills a caller's
// struct of possibly another minor version.
#pragma once

#include <tessera/tessera.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace tessera::sdk {

template <typename T>
struct StructSize;  // no size for a type that is no ABI struct: a compile error

#define TSR_SDK_STRUCT_SIZE(T)                       \
  template <>                                        \
  struct StructSize<T> {                             \
    static constexpr size_t value = T##_STRUCT_SIZE; \
  };
TSR_SDK_STRUCT_SIZE(tsr_plugin_descriptor)
TSR_SDK_STRUCT_SIZE(tsr_plugin_library)
TSR_SDK_STRUCT_SIZE(tsr_data_info)
TSR_SDK_STRUCT_SIZE(tsr_batch)
TSR_SDK_STRUCT_SIZE(tsr_dataset_vtable)
TSR_SDK_STRUCT_SIZE(tsr_run_info)
TSR_SDK_STRUCT_SIZE(tsr_device_memory)
TSR_SDK_STRUCT_SIZE(tsr_comm)
TSR_SDK_STRUCT_SIZE(tsr_host)
TSR_SDK_STRUCT_SIZE(tsr_param_info)
TSR_SDK_STRUCT_SIZE(tsr_model_init)
TSR_SDK_STRUCT_SIZE(tsr_forward_result)
TSR_SDK_STRUCT_SIZE(tsr_model_vtable)
TSR_SDK_STRUCT_SIZE(tsr_offload_setup)
TSR_SDK_STRUCT_SIZE(tsr_offload_step)
TSR_SDK_STRUCT_SIZE(tsr_offload_stats)
TSR_SDK_STRUCT_SIZE(tsr_speculate_stats)
TSR_SDK_STRUCT_SIZE(tsr_offload_vtable)
TSR_SDK_STRUCT_SIZE(tsr_ops)
TSR_SDK_STRUCT_SIZE(tsr_optimizer_step_args)
TSR_SDK_STRUCT_SIZE(tsr_optimizer_vtable)
TSR_SDK_STRUCT_SIZE(tsr_sampler_args)
TSR_SDK_STRUCT_SIZE(tsr_sampler_vtable)
TSR_SDK_STRUCT_SIZE(tsr_zero_plan)
TSR_SDK_STRUCT_SIZE(tsr_zero_setup)
TSR_SDK_STRUCT_SIZE(tsr_owned_range)
TSR_SDK_STRUCT_SIZE(tsr_zero_step)
TSR_SDK_STRUCT_SIZE(tsr_zero_vtable)
#undef TSR_SDK_STRUCT_SIZE

// An array element: its struct_size is the array's stride.
template <>
struct StructSize<tsr_param_decl> {
  static constexpr size_t value = sizeof(tsr_param_decl);
};

template <typename T>
inline constexpr size_t struct_size_v = StructSize<T>::value;

// Copies `src` into a caller's `out`: at most out->struct_size bytes (a
// caller of an older minor version has a shorter struct; one of a newer
// version keeps its later fields as it set them), and out->struct_size stays
// what the caller said. A struct_size of 0 is taken as this build's size.
template <typename T>
void copy_out(const T &src, T *out) {
  const size_t caller = out->struct_size ? out->struct_size : struct_size_v<T>;
  std::memcpy(static_cast<void *>(out), &src, std::min(caller, struct_size_v<T>));
  out->struct_size = caller;
}

}  // namespace tessera::sdk
