// What the optimizer plugins' steps take (sdk::optim::check_step_args):
// the CPU, and CUDA where this build has their kernels (TSR_PLUGIN_CUDA,
// set by their CMakeLists.txt when the toolkit is found); fp32, bf16 and
// fp16 gradients on every device they run on.
#pragma once

#include <tessera/cpp/optimizer.hpp>

namespace tessera::optimizers {

#if TSR_PLUGIN_CUDA
inline constexpr uint32_t kDevices = TSR_DEVICE_CPU | TSR_DEVICE_CUDA;
#else
inline constexpr uint32_t kDevices = TSR_DEVICE_CPU;
#endif
inline constexpr sdk::optim::StepSupport kSupport = {kDevices, true};

}  // namespace tessera::optimizers
