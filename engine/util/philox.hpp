// Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers:
// as easy as 1, 2, 3", SC11): a counter-based generator, so the i-th number
// of a stream is a pure function of (key, counter) with no state to carry.
// The dropout op (ABI 1.9) draws its masks from it on the CPU and in CUDA
// kernels alike: this header compiles in both, and the same key and
// counter give the same bits on either side.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TSR_PHILOX_FN __host__ __device__ __forceinline__
#else
#define TSR_PHILOX_FN inline
#endif

namespace tessera::philox {

struct Block {
  uint32_t w[4];
};

// The ten rounds: each multiplies two words into 64-bit products, swaps
// halves and folds in the key, which is bumped by the Weyl constants
// between rounds.
TSR_PHILOX_FN Block philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                  uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return Block{{c0, c1, c2, c3}};
}

// The block holding element `quad * 4 .. quad * 4 + 3` of stream (seed,
// stream), as the dropout op lays them out (sdk ops.h).
TSR_PHILOX_FN Block dropout_block(uint64_t seed, uint64_t stream, uint64_t quad) {
  return philox4x32_10(static_cast<uint32_t>(quad), static_cast<uint32_t>(quad >> 32),
                       static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32),
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// A word as a uniform in [0, 1): its top 24 bits times 2^-24, exact in float.
TSR_PHILOX_FN float uniform24(uint32_t w) {
  return static_cast<float>(w >> 8) * (1.0f / 16777216.0f);
}

// The dropout op's scale for kept elements, 1 / (1 - p) rounded to float
// from double: the CPU op and the CUDA op (on the host) both take it here.
inline float dropout_scale(float p) {
  return static_cast<float>(1.0 / (1.0 - static_cast<double>(p)));
}

}  // namespace tessera::philox
