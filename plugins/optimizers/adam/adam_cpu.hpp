// adam, adamw: the vector CPU kernels (adam_avx2.cpp, adam_avx512.cpp) as
// adam.cpp sees them: one function per gradient type and compute-copy type,
// in a table per instruction set, picked once per process from what the CPU
// has (adam.cpp).
//
// Each vector kernel computes exactly adam_update (adam.hpp): the same IEEE
// operations in the same order, lane by lane, no FMA (neither file is built
// with FMA enabled, and the library builds with -ffp-contract=off), so every
// instruction set gives the bits the scalar loop gives. The 16-bit
// conversions are the SDK's scalar ones done on vectors: bf16 widening is a
// shift, fp16 widening and rounding are the F16C instructions (IEEE, round
// to nearest even, like float_to_f16) with NaNs patched to the scalar
// results, and fp32 -> bf16 is float_to_bf16's integer rounding.
//
// The kernel files are compiled for their instruction set (CMakeLists.txt):
// everything in them is internal (an anonymous namespace) except the table
// getters below, so no inline function built for AVX-512 can stand in for
// the baseline copy of the same function elsewhere in the library.
#pragma once

#include <cstddef>

#include "adam.hpp"

// 1 where CMakeLists.txt builds the kernel files (x86-64).
#ifndef TSR_ADAM_SIMD
#define TSR_ADAM_SIMD 0
#endif

namespace tessera::adam {

// Elements per vector step: every kernel takes a multiple of this (adam.cpp
// does the head and tail of a segment with the scalar loop).
constexpr size_t kSimdBlock = 16;

// n elements (a multiple of kSimdBlock) of one segment. `grads` and `out`
// are typed by the table slot; `out` is NULL in the no-copy slot. With
// `stream`, the compute copy is written with non-temporal stores (it is not
// read back by this step, so fetching its lines first would only cost
// bandwidth) and `out` must be 64-byte aligned.
using SimdKernel = void (*)(float *p, const void *grads, float *m, float *v, size_t n,
                            const AdamConsts &k, void *out, bool stream);

// Slots by gradient type (0 float32, 1 bfloat16, 2 float16) and compute-copy
// type (0 none, 1 float32, 2 bfloat16, 3 float16).
struct SimdKernels {
  SimdKernel k[3][4];
};

#if TSR_ADAM_SIMD
// The tables of the kernel files, built on x86-64 only (TSR_ADAM_SIMD).
// Run a kernel only on a CPU that has its instruction set: AVX2 and F16C,
// or AVX-512F.
const SimdKernels *avx2_kernels();
const SimdKernels *avx512_kernels();
#endif

}  // namespace tessera::adam
