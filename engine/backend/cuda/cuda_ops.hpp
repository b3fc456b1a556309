// The CUDA ops table: float32, bfloat16 and float16 DLTensors in device
// memory (kDLCUDA), computed on the compute stream of backend/cuda/device.hpp. A call
// whose tensors all sit in host memory (kDLCPU, kDLCUDAHost) is forwarded to
// the CPU ops, so one table serves a CUDA run's host-side bookkeeping too.
// Built only with the CUDA parts (TESSERA_HAVE_CUDA).
#pragma once

#include <tessera/ops.h>

namespace tessera {

// The table, static storage for the life of the process. Using it requires
// cuda::select_device() to have run.
const tsr_ops *cuda_ops();

}  // namespace tessera
