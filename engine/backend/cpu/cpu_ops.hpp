// The CPU ops table: float32 DLTensors in host memory, kDLCPU or kDLCUDAHost
// (int32 targets and ids; cast converts float32/bfloat16/float16 and copy
// moves any dtype). Matmul and linear go to OpenBLAS; activations,
// attention and the softmax run on the ops' own thread pool (cpu_pool.hpp);
// the rest are plain loops.
#pragma once

#include <tessera/ops.h>

namespace tessera {

// The table, static storage for the life of the process.
const tsr_ops *cpu_ops();

// Switches OpenBLAS from its generic kernels to the CPU's own where it
// did not recognise the CPU (cpu_blas_core.cpp); once a process, before the
// first matmul (cpu_ops() calls it).
void cpu_blas_select_core();

// Threads the ops may use, OpenBLAS's and the pool's; n <= 0 means every
// core.
void cpu_ops_set_threads(int n);

}  // namespace tessera
