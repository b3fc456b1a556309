// The CPU ops table: float32 DLTensors in host memory, kDLCPU or kDLCUDAHost
// (int32 targets and ids; cast converts float32/bfloat16/float16 and copy
// moves any dtype). Matmul and linear go to OpenBLAS; the rest are plain
// loops.
#pragma once

#include <tessera/ops.h>

namespace tessera {

// The table, static storage for the life of the process.
const tsr_ops *cpu_ops();

// Threads OpenBLAS may use for matmul; n <= 0 means every core. The
// element-wise ops are single-threaded.
void cpu_ops_set_threads(int n);

}  // namespace tessera
