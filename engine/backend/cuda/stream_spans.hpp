// Spans of the compute stream's own time, timed with CUDA events and read
// back without blocking: what the GPU did between two points of the host's
// enqueueing, as opposed to how long the host took to enqueue it (the
// breakdown's host timers). Used for the GPU side of an offloaded step:
// the span of its passes and the time the stream sat at waits for the
// offloaded update (train/update_flight.cpp).
#pragma once

#include <cuda_runtime.h>

#include <vector>

namespace tessera::cuda {

class StreamSpans {
 public:
  StreamSpans() = default;
  ~StreamSpans();
  StreamSpans(const StreamSpans &) = delete;
  StreamSpans &operator=(const StreamSpans &) = delete;

  // Marks where a span starts / ends on the compute stream, in the order
  // the work is queued (begin, end, begin, end ...).
  void begin();
  void end();
  // Seconds of the spans whose ends the GPU has reached since the last
  // call; those it has not reached yet stay for a later call.
  double take();

 private:
  static constexpr size_t kMaxPending = 4096;
  cudaEvent_t event();
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pending_;
  std::vector<cudaEvent_t> spare_;
  cudaEvent_t open_ = nullptr;
};

}  // namespace tessera::cuda
