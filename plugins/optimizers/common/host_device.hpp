// TSR_HD marks the per-element update functions that the CPU loops (built
// by the C++ compiler) and the CUDA kernels (built by nvcc) share, so both
// devices run one definition of the math, in one order of operations.
#pragma once

#ifdef __CUDACC__
#define TSR_HD __host__ __device__ __forceinline__
#else
#define TSR_HD inline
#endif

// TSR_CPU_CLONES marks the CPU loops over a segment: on x86-64 the compiler
// builds one copy per instruction set (AVX-512, AVX2, the baseline SSE2) and
// the loader picks the best the machine has (an ifunc, resolved once). Only
// the vector width differs: every build compiles with -ffp-contract=off
// (no FMA contraction, which AVX-512 would otherwise bring), and add, mul,
// div and sqrt round the same on every width, so the three copies give the
// same bits, and the same bits as the CUDA kernels (-fmad=false).
// Not under TSan, whose runtime crashes in ifunc resolvers run at load.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__) && \
    !defined(__SANITIZE_THREAD__)
#define TSR_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TSR_CPU_CLONES
#endif
