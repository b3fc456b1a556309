// Which device a worker computes on: run.device (auto | cpu | cuda), the
// GPUs this process can see (CUDA_VISIBLE_DEVICES applied) and its
// LOCAL_RANK, which picks one of them.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>

#include "config/settings.hpp"

namespace tessera {

// Resolves run.device and run.precision for a rank with `local_rank` of
// `local_world` on its host, selects the GPU (CUDA runs) and returns the
// device. Throws a config error naming the key when the choice cannot run
// here (cuda without a GPU, bf16 on the CPU, more local ranks than GPUs).
DLDevice choose_device(const config::Settings &st, uint32_t local_rank, uint32_t local_world);

// "cpu" or "cuda:N (NVIDIA H200 ...)" for the start-up line.
std::string describe_device(DLDevice d);

}  // namespace tessera
