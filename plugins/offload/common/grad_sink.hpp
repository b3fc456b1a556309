// The gradient sink of the `cpu` and `nvme` offload backends
// (TSR_EXT_OFFLOAD_GRADS, ZeRO stage 3 with offloaded parameters): the zero
// plugin hands each bucket's reduced owned slice over as it completes, and
// the backend keeps every owned gradient in one host buffer (pinned in CUDA
// runs), where its CPU update reads them. No gradient slice stays on the
// device.
//
// put: the step's first contribution replaces what is held (add false), a
// later micro-batch's adds to it, in fp32 and rounded as the devices' axpy
// does, so the sum matches the zero plugin's own accumulation bit for bit.
// In a CUDA run the copy runs on the owner's device-to-host stream after
// the work the compute stream has queued so far; release makes later
// compute-stream work wait for it (the zero plugin then reuses the source).
// norm_sq: in a CPU run the host's sum_squares over the whole buffer, the op
// the zero plugin would run on its own slice, so clipping scales alike; in
// a CUDA run fixed chunks summed in a fixed order, so every run gives the
// same value.
//
// The owner guarantees what only it can know: no update still reads the
// gradients a put replaces, and the thread pool is free during an add or
// norm_sq.
#pragma once

#include <tessera/cpp/half.hpp>

#include "offload_common.hpp"

namespace tessera::offload {

// The gradient dtypes the host add can take: float32, bfloat16, float16.
inline void check_addable(DLDataType t, const char *who) {
  if (t.code == kDLFloat && t.bits == 32) return;
  if (t.bits != 16 || (t.code != kDLBfloat && t.code != kDLFloat))
    throw sdk::Error(TSR_ERR_UNSUPPORTED, fmt("%s: gradients of %u bits: no host add", who,
                                              static_cast<unsigned>(t.bits)));
}

// dst[i] += src[i] in the compute dtype, as the devices' axpy with alpha 1
// does it: in fp32, rounded to nearest even on the way back.
inline void add_into(void *dst, const void *src, size_t count, DLDataType t, const char *who) {
  check_addable(t, who);
  if (t.code == kDLFloat && t.bits == 32) {
    float *d = static_cast<float *>(dst);
    const float *x = static_cast<const float *>(src);
    for (size_t i = 0; i < count; ++i) d[i] += x[i];
    return;
  }
  const bool bf = t.code == kDLBfloat;
  uint16_t *d = static_cast<uint16_t *>(dst);
  const uint16_t *x = static_cast<const uint16_t *>(src);
  for (size_t i = 0; i < count; ++i) {
    const float a = bf ? sdk::bf16_to_float(d[i]) : sdk::f16_to_float(d[i]);
    const float b = bf ? sdk::bf16_to_float(x[i]) : sdk::f16_to_float(x[i]);
    d[i] = bf ? sdk::float_to_bf16(a + b) : sdk::float_to_f16(a + b);
  }
}

inline float element_as_float(const char *base, size_t i, DLDataType t) {
  if (t.bits == 32) return reinterpret_cast<const float *>(base)[i];
  const uint16_t h = reinterpret_cast<const uint16_t *>(base)[i];
  return t.code == kDLBfloat ? sdk::bf16_to_float(h) : sdk::f16_to_float(h);
}

struct GradSinkSetup {
  const tsr_host *host = nullptr;
  const char *who = "offload";
  size_t n = 0;  // owned elements
  DLDataType dtype{kDLFloat, 32, 1};
  // n elements of dtype in host memory the owner made (pinned in CUDA
  // runs); NULL: the backend holds no gradients (parameters on the device).
  char *data = nullptr;
  bool cuda = false;
  ThreadPool *pool = nullptr;
#if TSR_PLUGIN_CUDA
  CopyStreams *copies = nullptr;  // CUDA runs: the owner's, initialised
#endif
};

class GradSink {
 public:
  GradSink() = default;
  GradSink(const GradSink &) = delete;
  GradSink &operator=(const GradSink &) = delete;
  ~GradSink() {
#if TSR_PLUGIN_CUDA
    // Copies still queued write the owner's buffer: let them land first.
    if (s_.cuda && s_.copies && s_.copies->d2h) (void)cudaStreamSynchronize(s_.copies->d2h);
    for (cudaEvent_t e : events_)
      if (e) cudaEventDestroy(e);
#endif
  }

  void init(const GradSinkSetup &s) {
    s_ = s;
  }
  bool active() const {
    return s_.data != nullptr;
  }
  size_t bytes() const {
    return s_.data ? s_.n * dtype_bytes(s_.dtype) : 0;
  }
  // The held gradient of owned element `offset` (once settle() returned).
  const char *at(size_t offset) const {
    return s_.data + offset * dtype_bytes(s_.dtype);
  }

  // Owned [offset, offset + count) from device memory src; returns the
  // ticket of the copy that reads src.
  uint64_t put(size_t offset, size_t count, const void *src, bool add) {
    if (!s_.data)
      throw sdk::Error(TSR_ERR_INVALID,
                       fmt("%s: gradients handed over, but no host gradient buffer (the backend "
                           "holds gradients only with offloaded parameters)",
                           s_.who));
    check_owned_range(s_.who, offset, count, s_.n);
    if (add) check_addable(s_.dtype, s_.who);  // here, not on the pool's threads
    const size_t cb = dtype_bytes(s_.dtype);
    const uint64_t ticket = ++tickets_;
    char *dst = s_.data + offset * cb;
#if TSR_PLUGIN_CUDA
    if (s_.cuda) {
      s_.copies->after_compute(s_.host->compute_stream);
      cudaEvent_t &ev = events_[ticket % events_.size()];
      if (!ev) ev = make_event(s_.who);
      if (add && stage_.bytes() < count * cb)
        stage_ = sdk::Buffer(s_.host, DLDevice{kDLCUDAHost, 0}, count * cb, TSR_MEM_OTHER);
      char *to = add ? stage_.as<char>() : dst;
      cuda_check(cudaMemcpyAsync(to, src, count * cb, cudaMemcpyDeviceToHost, s_.copies->d2h),
                 s_.who, "copy gradients to the host");
      cuda_check(cudaEventRecord(ev, s_.copies->d2h), s_.who, "record");
      if (add) {  // a later micro-batch: added here once it has landed
        cuda_check(cudaEventSynchronize(ev), s_.who, "copy gradients to the host");
        add_on_pool(dst, to, count);
      }
      return ticket;
    }
#endif
    if (add)
      add_on_pool(dst, src, count);
    else
      std::memcpy(dst, src, count * cb);
    return ticket;
  }

  // Work queued on the compute stream from now on runs after put(ticket)'s
  // read of its source.
  void release(uint64_t ticket) {
#if TSR_PLUGIN_CUDA
    // One copy stream: an event re-recorded for a later ticket completes
    // after this one's copy, so waiting for it is safe (if later).
    if (s_.cuda) {
      cudaEvent_t ev = events_[ticket % events_.size()];
      if (ev)
        cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s_.host->compute_stream), ev, 0),
                   s_.who, "wait for the gradients' copy");
    }
#endif
    (void)ticket;
  }

  // Every put so far has landed in the buffer.
  void settle() {
#if TSR_PLUGIN_CUDA
    if (s_.cuda && s_.data)
      cuda_check(cudaStreamSynchronize(s_.copies->d2h), s_.who, "copy gradients to the host");
#endif
  }

  // The sum of squares of every held gradient.
  double norm_sq() {
    if (!s_.data)
      throw sdk::Error(
          TSR_ERR_INVALID,
          fmt("%s: gradient norm asked for, but the backend holds no gradients", s_.who));
    if (!s_.cuda) {
      int64_t n = static_cast<int64_t>(s_.n);
      DLTensor t = sdk::view(s_.data, DLDevice{kDLCPU, 0}, s_.dtype, 1, &n);
      double sq = 0;
      sdk::check(s_.host->ops->sum_squares(s_.host->ctx, &t, &sq));
      return sq;
    }
    settle();
    constexpr size_t kChunk = size_t{1} << 20;
    const size_t chunks = (s_.n + kChunk - 1) / kChunk;
    std::vector<double> part(chunks, 0.0);
    s_.pool->run(chunks, [&](size_t c) {
      double acc = 0;
      for (size_t i = c * kChunk, e = std::min(s_.n, i + kChunk); i < e; ++i) {
        const double x = element_as_float(s_.data, i, s_.dtype);
        acc += x * x;
      }
      part[c] = acc;
    });
    double sq = 0;
    for (double x : part) sq += x;
    return sq;
  }

 private:
  // dst += src over the pool, in fixed chunks (each element's sum does not
  // depend on them).
  void add_on_pool(char *dst, const void *src, size_t count) {
    constexpr size_t kChunk = size_t{1} << 18;
    const size_t cb = dtype_bytes(s_.dtype);
    s_.pool->run((count + kChunk - 1) / kChunk, [&](size_t c) {
      const size_t at = c * kChunk;
      add_into(dst + at * cb, static_cast<const char *>(src) + at * cb,
               std::min(kChunk, count - at), s_.dtype, s_.who);
    });
  }

  GradSinkSetup s_;
  uint64_t tickets_ = 0;
#if TSR_PLUGIN_CUDA
  std::array<cudaEvent_t, 8> events_{};  // the copies, by ticket modulo the ring
  sdk::Buffer stage_;                    // pinned: a later micro-batch's gradients, before the add
#endif
};

// The TSR_EXT_OFFLOAD_GRADS table of a backend whose self is a B: B has
// `host`, check_range(offset, count) and sink_put, sink_release and
// sink_norm_sq, which first wait for what only that backend knows of (the
// cpu backend's overlapped updates) and then call its GradSink.
template <class B>
struct GradsExtension {
  static tsr_status put(void *self, size_t offset, size_t count, const void *src, int32_t add,
                        uint64_t *ticket) {
    auto *s = static_cast<B *>(self);
    return sdk::guard(s->host, [&] {
      s->check_range(offset, count);
      *ticket = s->sink_put(offset, count, src, add != 0);
    });
  }
  static tsr_status release(void *self, uint64_t ticket) {
    auto *s = static_cast<B *>(self);
    return sdk::guard(s->host, [&] { s->sink_release(ticket); });
  }
  static tsr_status norm_sq(void *self, double *out) {
    auto *s = static_cast<B *>(self);
    return sdk::guard(s->host, [&] { *out = s->sink_norm_sq(); });
  }
  static inline const tsr_ext_offload_grads table = {tsr_ext_offload_grads_STRUCT_SIZE, put,
                                                     release, norm_sq};
};

}  // namespace tessera::offload
