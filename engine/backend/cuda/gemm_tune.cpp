// Timed choice among cuBLASLt's candidate algorithms (gemm_tune.hpp).
#include "backend/cuda/gemm_tune.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "backend/cuda/cuda_ops_internal.hpp"

namespace tessera::cuda {

bool gemm_tuning() {
  static const bool on = [] {
    const char *e = std::getenv("TESSERA_GEMM_TUNING");
    const std::string v = e ? e : "";
    if (v.empty() || v == "timed") return true;
    if (v == "heuristic") return false;
    throw Error(TSR_ERR_INVALID, "TESSERA_GEMM_TUNING=" + v + ": expected timed or heuristic");
  }();
  return on;
}

namespace {

// Events for one timing, destroyed on every path out.
struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  Events() {
    TSR_CUDA_CHECK(cudaEventCreate(&start));
    TSR_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Events() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  Events(const Events &) = delete;
  Events &operator=(const Events &) = delete;
};

bool launch(const TuneCall &c, const cublasLtMatmulAlgo_t &algo, void *d) {
  return cublasLtMatmul(c.handle, c.desc, &c.alpha, c.A, c.la, c.B, c.lb, &c.beta, d, c.lc, d, c.lc,
                        &algo, c.workspace, c.workspace_bytes,
                        compute_stream()) == CUBLAS_STATUS_SUCCESS;
}

// Milliseconds of `reps` back-to-back runs, or infinity when the candidate
// fails to launch (a candidate the heuristic offered but cannot run here).
float time_runs(const TuneCall &c, const cublasLtMatmulAlgo_t &algo, void *d, int reps,
                Events &ev) {
  const cudaStream_t s = compute_stream();
  TSR_CUDA_CHECK(cudaEventRecord(ev.start, s));
  for (int r = 0; r < reps; r++)
    if (!launch(c, algo, d)) {
      TSR_CUDA_CHECK(cudaStreamSynchronize(s));
      return std::numeric_limits<float>::infinity();
    }
  TSR_CUDA_CHECK(cudaEventRecord(ev.stop, s));
  TSR_CUDA_CHECK(cudaEventSynchronize(ev.stop));
  float ms = 0.0f;
  TSR_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
  return ms;
}

}  // namespace

cublasLtMatmulAlgo_t tune_gemm(const TuneCall &c, const std::vector<cublasLtMatmulAlgo_t> &cand,
                               const std::string &what) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TSR_CUDA_CHECK(cudaStreamIsCapturing(compute_stream(), &capture));
  if (capture != cudaStreamCaptureStatusNone) return cand.front();
  // An accumulation (beta != 0) runs into scratch: the real call must see
  // D as it was.
  void *scratch_d = nullptr;
  if (c.beta != 0.0f) scratch_d = device_alloc(c.d_bytes);
  void *d = scratch_d ? scratch_d : c.D;
  Events ev;
  // Enough repetitions for ~2 ms of work a candidate (at least 3), from
  // one warm run of the heuristic's pick.
  launch(c, cand.front(), d);
  const float once = time_runs(c, cand.front(), d, 1, ev);
  const int reps = once > 0.0f && once < 2.0f ? std::min(50, std::max(3, int(2.0f / once))) : 3;
  std::vector<float> ms(cand.size());
  size_t best = 0;
  for (size_t i = 0; i < cand.size(); i++) {
    if (!launch(c, cand[i], d)) {  // warm-up; a failing candidate is skipped
      ms[i] = std::numeric_limits<float>::infinity();
      continue;
    }
    ms[i] = time_runs(c, cand[i], d, reps, ev) / static_cast<float>(reps);
    if (ms[i] < ms[best]) best = i;
  }
  if (scratch_d) device_free(scratch_d);
  if (best != 0 && !(ms[best] < 0.97f * ms[0])) best = 0;
  spdlog::debug("matmul {}: candidate {} of {} ({:.1f} us; the heuristic's first {:.1f} us)", what,
                best, cand.size(), 1000.0f * ms[best], 1000.0f * ms[0]);
  return cand[best];
}

}  // namespace tessera::cuda
