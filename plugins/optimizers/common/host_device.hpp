// TSR_HD marks the per-element update functions that the CPU loops (built
// by the C++ compiler) and the CUDA kernels (built by nvcc) share, so both
// devices run one definition of the math, in one order of operations.
#pragma once

#ifdef __CUDACC__
#define TSR_HD __host__ __device__ __forceinline__
#else
#define TSR_HD inline
#endif
