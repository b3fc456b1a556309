// Spans of the compute stream's time (stream_spans.hpp).
#include "backend/cuda/stream_spans.hpp"

#include "backend/cuda/device.hpp"

namespace tessera::cuda {

StreamSpans::~StreamSpans() {
  // The stream may still be about to reach them: destroying a recorded
  // event is allowed, CUDA releases it once the stream has passed it.
  for (auto &[a, b] : pending_) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  if (open_) cudaEventDestroy(open_);
}

cudaEvent_t StreamSpans::event() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  TSR_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void StreamSpans::begin() {
  if (open_) return;  // already open: the earlier start stands
  open_ = event();
  TSR_CUDA_CHECK(cudaEventRecord(open_, compute_stream()));
}

void StreamSpans::end() {
  if (!open_) return;
  cudaEvent_t e = event();
  TSR_CUDA_CHECK(cudaEventRecord(e, compute_stream()));
  pending_.emplace_back(open_, e);
  open_ = nullptr;
  // Nobody taking them (or a stream that never gets there): keep a bounded
  // number rather than an event pair per span for the whole run.
  if (pending_.size() > kMaxPending) {
    cudaEventDestroy(pending_.front().first);
    cudaEventDestroy(pending_.front().second);
    pending_.erase(pending_.begin());
  }
}

double StreamSpans::take() {
  double s = 0;
  size_t done = 0;
  // The stream reaches the ends in the order they were queued.
  for (; done < pending_.size(); ++done) {
    auto [a, b] = pending_[done];
    if (cudaEventQuery(b) != cudaSuccess) break;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, a, b) == cudaSuccess) s += ms / 1e3;
    spare_.push_back(a);
    spare_.push_back(b);
  }
  (void)cudaGetLastError();  // not ready is no error
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
  return s;
}

}  // namespace tessera::cuda
