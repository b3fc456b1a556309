// The CPU ops table: float32 DLTensors in host memory (int32 targets for
// cross_entropy). Matmul goes to OpenBLAS; the rest are plain loops.
#pragma once

#include <tessera/ops.h>

namespace tessera {

// The table, static storage for the life of the process.
const tsr_ops *cpu_ops();

// Threads OpenBLAS may use for matmul; n <= 0 means every core. The
// element-wise ops are single-threaded.
void cpu_ops_set_threads(int n);

}  // namespace tessera
