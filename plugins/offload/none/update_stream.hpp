// Offload "none" on CUDA with `overlap = true`: the optimizer step runs on a
// stream of the plugin's own instead of the compute stream, so the next
// forward need not wait for the whole update, only for the group it is about
// to use (the host asks through wait_params just before the group's first
// use). The update is memory-bound and the forward's matmuls are not, so
// the two share the GPU instead of taking turns.
//
// Ordering, all on the GPU (the host never blocks):
//   - each range's step waits for everything queued on the compute stream
//     when it is handed over (the backward and the norm that produced its
//     gradients), then records an event of its own;
//   - wait_params(offset, count) makes the compute stream wait for the
//     events of the ranges that overlap [offset, offset + count);
//   - wait_grads (before the gradients are cleared or overwritten) and
//     settle (flush, state copies) make it wait for the last one.
// The same kernels as on the compute stream, in the same order per element:
// the parameters and state are bit for bit those of `overlap = false`.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace tessera::offload_none {

inline void cuda_ok(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    throw sdk::Error(TSR_ERR_INTERNAL,
                     std::string("offload none: ") + what + ": " + cudaGetErrorString(e));
}

class UpdateStream {
 public:
  explicit UpdateStream(void *compute) : compute_(static_cast<cudaStream_t>(compute)) {
    // The compute stream's priority: neither starves the other, and a
    // group's update still lands in the order the forward asks for them.
    int least = 0, greatest = 0;
    cuda_ok(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities");
    cuda_ok(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, least), "update stream");
    cuda_ok(cudaEventCreateWithFlags(&handed_, cudaEventDisableTiming), "event");
  }
  UpdateStream(const UpdateStream &) = delete;
  UpdateStream &operator=(const UpdateStream &) = delete;
  ~UpdateStream() {
    // Nothing may still read the buffers the plugin frees next.
    if (stream_) cudaStreamSynchronize(stream_);
    for (const Range &r : ranges_) cudaEventDestroy(r.done);
    if (handed_) cudaEventDestroy(handed_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // The stream a range's step goes on, ordered after the compute stream's
  // work so far. Call before queueing the step, then landed() after.
  cudaStream_t begin_range() {
    cuda_ok(cudaEventRecord(handed_, compute_), "record");
    cuda_ok(cudaStreamWaitEvent(stream_, handed_, 0), "wait for the gradients");
    return stream_;
  }

  // The step of owned [offset, offset + count) is queued: its event marks
  // where it ends. A range handed over again (the next update) replaces its
  // entry, whose wait, if any, was queued before.
  void landed(size_t offset, size_t count) {
    size_t i = 0;
    while (i < ranges_.size() && !(ranges_[i].offset == offset && ranges_[i].count == count)) ++i;
    if (i == ranges_.size()) {
      cudaEvent_t e = nullptr;
      cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
      ranges_.push_back({offset, count, e, false});
    }
    cuda_ok(cudaEventRecord(ranges_[i].done, stream_), "record");
    ranges_[i].pending = true;
    last_ = ranges_[i].done;
  }

  // The compute stream waits for every pending range that overlaps
  // [offset, offset + count).
  void wait(size_t offset, size_t count) {
    for (Range &r : ranges_)
      if (r.pending && r.offset < offset + count && offset < r.offset + r.count) {
        cuda_ok(cudaStreamWaitEvent(compute_, r.done, 0), "wait for the update");
        r.pending = false;
      }
  }

  // The compute stream waits for every step queued so far (the stream runs
  // them in order, so the last event covers all).
  void wait_all() {
    if (!last_) return;
    cuda_ok(cudaStreamWaitEvent(compute_, last_, 0), "wait for the update");
    for (Range &r : ranges_) r.pending = false;
    last_ = nullptr;
  }

 private:
  struct Range {
    size_t offset, count;
    cudaEvent_t done;
    bool pending;
  };
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  cudaEvent_t handed_ = nullptr, last_ = nullptr;
  std::vector<Range> ranges_;  // every range stepped so far, each with its own event
};

}  // namespace tessera::offload_none
