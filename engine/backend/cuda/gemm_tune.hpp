// Private to the CUDA matmuls: choosing a matmul's cuBLASLt algorithm by
// timing the heuristic's candidates on the first call of each problem,
// instead of taking the heuristic's first answer. The heuristic ranks by a
// model of the GPU; at GPT-2's shapes on the H200 its first pick is not
// always the fastest (split-K weight gradients, wave tails of M = 4096).
//
// Tuning is on unless TESSERA_GEMM_TUNING=heuristic: the fastest algorithm
// can differ between processes when two candidates time alike, and
// different algorithms round differently, so a run that must repeat
// another process's bits takes the heuristic's first pick.
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::cuda {

// How many candidates the heuristic is asked for when tuning.
inline constexpr int kTuneCandidates = 8;

// True unless TESSERA_GEMM_TUNING=heuristic (read once; another value than
// "timed" or "heuristic" throws, naming the variable).
bool gemm_tuning();

// One matmul as cublasLtMatmul takes it (cuBLASLt's A, B, C = D), with the
// bytes of D for a scratch copy when beta is not zero.
struct TuneCall {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  const void *A, *B;
  void *D;
  float alpha, beta;
  void *workspace;
  size_t workspace_bytes;
  size_t d_bytes;
};

// Times every candidate on the call's operands (D itself when beta is 0,
// as the real call overwrites it; else a scratch D, so an accumulation is
// not run twice) on the compute stream, and returns the fastest. The first
// candidate (the heuristic's pick) is kept unless another is at least 3%
// faster, so timing noise between near-equal algorithms does not decide.
// Synchronizes the stream: call it outside a CUDA graph capture (it returns
// the first candidate untimed during one).
cublasLtMatmulAlgo_t tune_gemm(const TuneCall &call,
                               const std::vector<cublasLtMatmulAlgo_t> &candidates,
                               const std::string &what);

}  // namespace tessera::cuda
