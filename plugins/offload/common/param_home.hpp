// Parameter offload (`params = "cpu"`, DeepSpeed's offload_param): the
// owned compute parameters kept by the offload backend in host memory
// instead of by the zero plugin on the device (TSR_EXT_OFFLOAD_PARAMS).
//
// The backend's update writes the bf16 (or fp32) compute copy straight into
// this home; under ZeRO stage 3 the zero plugin fetches a group's owned
// slice just before the group is used. In a CUDA run the home is pinned and
// a fetch is one copy on the backend's host-to-device stream, ordered after
// the work the compute stream has queued so far (the destination may be a
// buffer the last group was computing from), and the compute stream waits
// for it only where the zero plugin says the group is needed (ready).
#pragma once

#include <deque>
#include <string>
#include <tessera/cpp/half.hpp>
#include <tessera/cpp/meminfo.hpp>

#include "offload_common.hpp"

namespace tessera::offload {

// What `params` asks for: TSR_PARAMS_ON_DEVICE ("none"), _ON_HOST ("cpu"),
// _ON_DISK ("nvme"), refusing a value this backend does not offer with what
// to write instead.
inline int32_t parse_params_home(const std::string &v, const char *who, bool disk_ok) {
  if (v == "none") return TSR_PARAMS_ON_DEVICE;
  if (v == "cpu") return TSR_PARAMS_ON_HOST;
  if (v == "nvme" && disk_ok) return TSR_PARAMS_ON_DISK;
  if (v == "nvme")
    throw sdk::Error(TSR_ERR_INVALID,
                     fmt("%s: params = \"nvme\" keeps the parameters on disk, which the nvme "
                         "backend does: set [offload] plugin = \"nvme\" (with path), or "
                         "params = \"cpu\"",
                         who));
  throw sdk::Error(TSR_ERR_INVALID, fmt("%s: params = \"%s\": expected \"none\", \"cpu\"%s", who,
                                        v.c_str(), disk_ok ? " or \"nvme\"" : ""));
}

// `n` fp32 values as the compute dtype (the rounding the optimizers use).
inline void to_compute(const float *src, size_t n, DLDataType t, void *dst) {
  if (is_f32(t)) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  auto *out = static_cast<uint16_t *>(dst);
  const bool bf16 = t.code == kDLBfloat;
  for (size_t i = 0; i < n; ++i)
    out[i] = bf16 ? sdk::float_to_bf16(src[i]) : sdk::float_to_f16(src[i]);
}

// This rank's part of the host memory available (0: nothing readable).
inline double host_memory_share(const tsr_host *host) {
  const sdk::HostMemory avail = sdk::host_memory_available();
  const uint32_t local = host->run ? std::max<uint32_t>(1, host->run->local_world_size) : 1;
  return static_cast<double>(avail.bytes) / local;
}

// The host memory `bytes` more need, against what this machine has
// available (sdk::host_memory_available: MemAvailable, the cgroup's limit
// left, or TESSERA_HOST_MEMORY_AVAILABLE) shared by the ranks on it:
// refused before anything is allocated, naming both and where the figure
// came from, rather than an OOM kill mid-run.
inline void check_host_memory(const tsr_host *host, const char *who, double bytes,
                              const std::string &what) {
  const sdk::HostMemory avail = sdk::host_memory_available();
  if (avail.bytes == 0) return;  // nothing readable: nothing to check against
  const uint32_t local = host->run ? std::max<uint32_t>(1, host->run->local_world_size) : 1;
  const double share = static_cast<double>(avail.bytes) / local;
  if (bytes <= share) return;
  throw sdk::Error(
      TSR_ERR_NO_MEMORY,
      fmt("%s (rank %u): %s need %s (%.0f bytes) of host memory, but %s (%.0f bytes) is available "
          "to this rank (%s%s); use more ranks or machines with a higher ZeRO stage, offload to "
          "NVMe ([offload] plugin = \"nvme\"), or a smaller model",
          who, host->run ? host->run->rank : 0, what.c_str(), sdk::format_bytes(bytes).c_str(),
          bytes, sdk::format_bytes(share).c_str(), share, avail.source.c_str(),
          local > 1 ? fmt(", shared by the %u ranks on this machine", local).c_str() : ""));
}

class ParamHome {
 public:
  // n owned elements of `dtype`; `data`: host memory the backend made
  // (pinned in CUDA runs) of n elements.
  void init(const char *who, size_t n, DLDataType dtype, char *data, bool cuda, int device) {
    who_ = who;
    n_ = n;
    dtype_ = dtype;
    data_ = data;
    cuda_ = cuda;
    (void)device;
#if TSR_PLUGIN_CUDA
    if (cuda_) streams_.init(who);
#endif
  }
  bool active() const {
    return data_ != nullptr;
  }
  char *at(size_t offset) const {
    return data_ + offset * dtype_bytes(dtype_);
  }
  size_t bytes() const {
    return n_ * dtype_bytes(dtype_);
  }

  // The master weights of [offset, offset + count) as the compute copy.
  void put_master(size_t offset, size_t count, const float *src) {
    to_compute(src, count, dtype_, at(offset));
  }

  // Copies [offset, offset + count) to `dst` (compute device); the caller
  // has waited for the update of those elements. Returns the ticket.
  uint64_t fetch(size_t offset, size_t count, void *dst, void *compute_stream) {
    const size_t bytes = count * dtype_bytes(dtype_);
    if (!cuda_) {
      std::memcpy(dst, at(offset), bytes);
      return 0;
    }
#if TSR_PLUGIN_CUDA
    cuda_check(cudaEventRecord(streams_.ready, static_cast<cudaStream_t>(compute_stream)), who_,
               "record");
    cuda_check(cudaStreamWaitEvent(streams_.h2d, streams_.ready, 0), who_, "wait");
    cuda_check(cudaMemcpyAsync(dst, at(offset), bytes, cudaMemcpyHostToDevice, streams_.h2d), who_,
               "copy parameters to the GPU");
    const uint64_t ticket = next_++;
    if (events_.size() < kEvents) events_.push_back(make_event(who_));
    cuda_check(cudaEventRecord(events_[ticket % kEvents], streams_.h2d), who_, "record");
    return ticket;
#else
    (void)compute_stream;
    return 0;
#endif
  }
  // Work queued on the compute stream from now on sees fetch(ticket)'s copy.
  void ready(uint64_t ticket, void *compute_stream) {
    if (!cuda_) return;
#if TSR_PLUGIN_CUDA
    // The zero plugin keeps at most a few groups live; a ticket this old
    // was waited for long ago.
    if (ticket + kEvents < next_) return;
    cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(compute_stream),
                                   events_[ticket % kEvents], 0),
               who_, "wait for the parameters' copy");
#else
    (void)ticket;
    (void)compute_stream;
#endif
  }
  // Every copy out of the home has landed (before the home is rewritten
  // outside the step's order, and at the end).
  void finish() {
#if TSR_PLUGIN_CUDA
    if (cuda_) cuda_check(cudaStreamSynchronize(streams_.h2d), who_, "copy stream");
#endif
  }
  ~ParamHome() {
#if TSR_PLUGIN_CUDA
    if (cuda_) {
      (void)cudaStreamSynchronize(streams_.h2d);
      for (cudaEvent_t e : events_) cudaEventDestroy(e);
    }
#endif
  }

 private:
  static constexpr size_t kEvents = 16;
  const char *who_ = "offload";
  size_t n_ = 0;
  DLDataType dtype_{kDLFloat, 32, 1};
  char *data_ = nullptr;
  bool cuda_ = false;
  uint64_t next_ = 0;
#if TSR_PLUGIN_CUDA
  CopyStreams streams_;
  std::deque<cudaEvent_t> events_;
#endif
};

}  // namespace tessera::offload
