// The overlapped host update (pipeline.hpp).
#include "pipeline.hpp"

#include <chrono>

namespace tessera::offload {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The gradient dtypes add_into can add: float32, bfloat16, float16.
void check_addable(DLDataType t, const char *who) {
  if (t.code == kDLFloat && t.bits == 32) return;
  if (t.bits != 16 || (t.code != kDLBfloat && t.code != kDLFloat))
    throw sdk::Error(TSR_ERR_UNSUPPORTED, fmt("%s: gradients of %u bits: no host add", who,
                                              static_cast<unsigned>(t.bits)));
}

// dst[i] += src[i] in the compute dtype, as the devices' axpy with alpha 1
// does it: in fp32, rounded to nearest even on the way back.
void add_into(void *dst, const void *src, size_t count, DLDataType t, const char *who) {
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
    const float a = bf ? sdk::optim::bf16_to_float(d[i]) : sdk::optim::f16_to_float(d[i]);
    const float b = bf ? sdk::optim::bf16_to_float(x[i]) : sdk::optim::f16_to_float(x[i]);
    d[i] = bf ? sdk::optim::float_to_bf16(a + b) : sdk::optim::float_to_f16(a + b);
  }
}

float element(const char *base, size_t i, DLDataType t) {
  if (t.bits == 32) return reinterpret_cast<const float *>(base)[i];
  const uint16_t h = reinterpret_cast<const uint16_t *>(base)[i];
  return t.code == kDLBfloat ? sdk::optim::bf16_to_float(h) : sdk::optim::f16_to_float(h);
}

}  // namespace

HostPipeline::HostPipeline(const PipelineSetup &s) : s_(s) {
#if TSR_PLUGIN_CUDA
  if (s_.cuda) copies_.init(s_.who);
#endif
  thread_ = std::thread([this] { serve(); });
}

HostPipeline::~HostPipeline() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_.notify_all();
  thread_.join();
#if TSR_PLUGIN_CUDA
  if (s_.cuda) {
    // Copies still queued reference our buffers: let them land first.
    (void)cudaStreamSynchronize(copies_.d2h);
    (void)cudaStreamSynchronize(copies_.h2d);
    for (auto &ev : events_)
      for (cudaEvent_t e : ev) cudaEventDestroy(e);
    for (cudaEvent_t e : sink_events_)
      if (e) cudaEventDestroy(e);
  }
#endif
}

void HostPipeline::submit(RangeUpdate u) {
  // A new step: the last step's ranges are complete by now (the forward in
  // between waited for each), so retiring them costs nothing; it also
  // guarantees no upload of the last step still reads the pinned buffer
  // this step's update writes.
  if (!jobs_.empty() && u.step != step_) retire();
  step_ = u.step;
  std::unique_lock<std::mutex> lk(mu_);
#if TSR_PLUGIN_CUDA
  if (s_.cuda) {
    const size_t k = jobs_.size();
    // Ordered after what the compute stream has queued so far: the backward
    // that produced these gradients (and, when the range comes during
    // backward, its use of the range's parameters before it said so).
    copies_.after_compute(s_.host->compute_stream);
    if (events_.size() <= k) {
      std::array<cudaEvent_t, 4> ev{};
      for (cudaEvent_t &e : ev) cuda_check(cudaEventCreate(&e), s_.who, "event");
      events_.push_back(ev);
    }
    const std::array<cudaEvent_t, 4> &ev = events_[k];
    const size_t cb = dtype_bytes(s_.compute_dtype);
    cuda_check(cudaEventRecord(ev[0], copies_.d2h), s_.who, "record");
    // No gradients handed over: the sink's copies put them in place
    // already, and ev[1] comes after those on the same stream.
    if (u.grads)
      cuda_check(cudaMemcpyAsync(s_.grads_pinned + u.offset * cb, u.grads, u.count * cb,
                                 cudaMemcpyDeviceToHost, copies_.d2h),
                 s_.who, "copy gradients to the host");
    cuda_check(cudaEventRecord(ev[1], copies_.d2h), s_.who, "record");
  }
#endif
  jobs_.push_back(Job{std::move(u), false, TSR_OK, {}, 0});
  lk.unlock();
  work_.notify_one();
}

void HostPipeline::serve() {
#if TSR_PLUGIN_CUDA
  if (s_.cuda) (void)cudaSetDevice(s_.device);  // copies from this thread go to the run's GPU
#endif
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_.wait(lk, [&] { return stop_ || next_ < jobs_.size(); });
    if (stop_) return;
    const size_t k = next_++;
    Job &j = jobs_[k];
    void *events = nullptr;
#if TSR_PLUGIN_CUDA
    if (s_.cuda) events = &events_[k];
#endif
    lk.unlock();
    process(j, k, events);
    lk.lock();
    host_s_ += j.host_s;
    elements_ += j.u.count;
    j.done = true;
    done_.notify_all();
  }
}

// One range, on the dispatcher thread. Failures are kept with the job and
// raised on the thread that waits for it.
void HostPipeline::process(Job &j, size_t, void *events) {
  const RangeUpdate &r = j.u;
  HostUpdate u;
  u.master = s_.slots[0] + r.offset;
  u.state_count = s_.state_count;
  for (uint32_t i = 0; i < s_.state_count; ++i) u.state[i] = s_.slots[1 + i] + r.offset;
  u.owned = r.offset;
  u.count = r.count;
  u.segments = r.segments.data();
  u.num_segments = r.segments.size();
  u.lr = r.lr;
  u.grad_scale = r.grad_scale;
  u.step = r.step;
  u.grads_dtype = s_.compute_dtype;
  u.out_dtype = s_.compute_dtype;
  u.grads = r.grads ? r.grads : s_.grads_host + r.offset * dtype_bytes(s_.compute_dtype);
  u.params_out = r.params;
#if TSR_PLUGIN_CUDA
  const size_t cb = dtype_bytes(s_.compute_dtype);
  auto &ev = *static_cast<std::array<cudaEvent_t, 4> *>(events);
  if (s_.cuda) {
    if (cudaEventSynchronize(ev[1]) != cudaSuccess) {
      j.status = TSR_ERR_INTERNAL;
      j.error =
          std::string("copy of gradients to the host: ") + cudaGetErrorString(cudaGetLastError());
      return;
    }
    u.grads = s_.grads_pinned + r.offset * cb;
    u.params_out = s_.params_pinned + r.offset * cb;
  }
#else
  (void)events;
#endif
  if (s_.params_home) u.params_out = s_.params_home + r.offset * dtype_bytes(s_.compute_dtype);
  const auto t0 = std::chrono::steady_clock::now();
  j.status = run_update(*s_.pool, s_.opt, s_.opt_self, u);
  j.host_s = seconds_since(t0);
  if (j.status != TSR_OK) {
    j.error = "the optimizer's CPU step failed";
    return;
  }
#if TSR_PLUGIN_CUDA
  if (s_.cuda && !s_.params_home) {
    cudaError_t e = cudaEventRecord(ev[2], copies_.h2d);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(r.params, s_.params_pinned + r.offset * cb, r.count * cb,
                          cudaMemcpyHostToDevice, copies_.h2d);
    if (e == cudaSuccess) e = cudaEventRecord(ev[3], copies_.h2d);
    if (e != cudaSuccess) {
      j.status = TSR_ERR_INTERNAL;
      j.error = std::string("copy of parameters to the GPU: ") + cudaGetErrorString(e);
    }
  }
#endif
}

void HostPipeline::raise(const Job &j) const {
  throw sdk::Error(j.status, fmt("%s: update of owned elements [%zu, %zu): %s", s_.who, j.u.offset,
                                 j.u.offset + j.u.count, j.error.c_str()));
}

void HostPipeline::wait_done(size_t k, std::unique_lock<std::mutex> &lk) {
  done_.wait(lk, [&] { return jobs_[k].done; });
  if (jobs_[k].status != TSR_OK) raise(jobs_[k]);
}

void HostPipeline::wait_range(size_t offset, size_t count) {
  std::unique_lock<std::mutex> lk(mu_);
  for (size_t k = 0; k < jobs_.size(); ++k) {
    const RangeUpdate &r = jobs_[k].u;
    if (r.offset < offset + count && r.offset + r.count > offset) wait_done(k, lk);
  }
}

void HostPipeline::wait_params(size_t offset, size_t count) {
  // Offloaded parameters go to the device only when fetched, after this.
  if (s_.params_home) return wait_range(offset, count);
  std::unique_lock<std::mutex> lk(mu_);
  for (size_t k = 0; k < jobs_.size(); ++k) {
    const RangeUpdate &r = jobs_[k].u;
    if (r.offset >= offset + count || r.offset + r.count <= offset) continue;
    wait_done(k, lk);
#if TSR_PLUGIN_CUDA
    if (s_.cuda)
      cuda_check(
          cudaStreamWaitEvent(static_cast<cudaStream_t>(s_.host->compute_stream), events_[k][3], 0),
          s_.who, "wait for the upload");
#endif
  }
}

void HostPipeline::wait_grads() {
  std::unique_lock<std::mutex> lk(mu_);
  if (jobs_.empty()) return;
#if TSR_PLUGIN_CUDA
  if (s_.cuda) {
    // The gradients were read by the copies (in order on one stream); the
    // CPU works from the pinned copy.
    cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s_.host->compute_stream),
                                   events_[jobs_.size() - 1][1], 0),
               s_.who, "wait for the gradients' copy");
    return;
  }
#endif
  // On the CPU the update reads the gradients in place, to its end.
  for (size_t k = 0; k < jobs_.size(); ++k) wait_done(k, lk);
}

void HostPipeline::retire() {
  std::unique_lock<std::mutex> lk(mu_);
  for (size_t k = 0; k < jobs_.size(); ++k) wait_done(k, lk);
#if TSR_PLUGIN_CUDA
  if (s_.cuda && !jobs_.empty()) {
    if (!s_.params_home)
      cuda_check(cudaEventSynchronize(events_[jobs_.size() - 1][3]), s_.who, "upload");
    for (size_t k = 0; k < jobs_.size(); ++k) {
      float d2h = 0, h2d = 0;
      if (cudaEventElapsedTime(&d2h, events_[k][0], events_[k][1]) == cudaSuccess)
        d2h_s_ += d2h / 1e3;
      if (!s_.params_home &&
          cudaEventElapsedTime(&h2d, events_[k][2], events_[k][3]) == cudaSuccess)
        h2d_s_ += h2d / 1e3;
      (void)cudaGetLastError();
    }
  }
#endif
  jobs_.clear();
  next_ = 0;
}

void HostPipeline::flush() {
  retire();
}

uint64_t HostPipeline::sink_put(size_t offset, size_t count, const void *src, bool add) {
  wait_range(offset, count);  // the last update of these has read their old gradients
  const size_t cb = dtype_bytes(s_.compute_dtype);
  const uint64_t ticket = ++tickets_;
#if TSR_PLUGIN_CUDA
  if (s_.cuda) {
    copies_.after_compute(s_.host->compute_stream);
    cudaEvent_t &ev = sink_events_[ticket % sink_events_.size()];
    if (!ev) cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), s_.who, "event");
    if (add && sink_stage_.bytes() < count * cb)
      sink_stage_ = sdk::Buffer(s_.host, DLDevice{kDLCUDAHost, 0}, count * cb, TSR_MEM_OTHER);
    char *dst = add ? sink_stage_.as<char>() : s_.grads_pinned + offset * cb;
    cuda_check(cudaMemcpyAsync(dst, src, count * cb, cudaMemcpyDeviceToHost, copies_.d2h), s_.who,
               "copy gradients to the host");
    cuda_check(cudaEventRecord(ev, copies_.d2h), s_.who, "record");
    if (add) {  // a later micro-batch: added here once it has landed
      cuda_check(cudaEventSynchronize(ev), s_.who, "copy gradients to the host");
      add_on_pool(s_.grads_pinned + offset * cb, dst, count);
    }
    return ticket;
  }
#endif
  if (!s_.grads_host)
    throw sdk::Error(TSR_ERR_INVALID,
                     fmt("%s: gradients handed over, but no host gradient buffer (the backend "
                         "holds gradients only with offloaded parameters)",
                         s_.who));
  char *dst = s_.grads_host + offset * cb;
  if (add)
    add_on_pool(dst, src, count);
  else
    std::memcpy(dst, src, count * cb);
  return ticket;
}

// dst += src over the pool, in fixed chunks (the sum of each element does
// not depend on them). The pool must be free of updates: a later
// micro-batch's backward follows a whole forward, which waited for every
// range's update, so the wait below returns at once; it is the guarantee.
// The dtype is checked here, not on the pool's threads.
void HostPipeline::add_on_pool(char *dst, const void *src, size_t count) {
  wait_range(0, s_.n);
  check_addable(s_.compute_dtype, s_.who);
  constexpr size_t kChunk = size_t{1} << 18;
  const size_t cb = dtype_bytes(s_.compute_dtype);
  s_.pool->run((count + kChunk - 1) / kChunk, [&](size_t c) {
    const size_t at = c * kChunk;
    add_into(dst + at * cb, static_cast<const char *>(src) + at * cb, std::min(kChunk, count - at),
             s_.compute_dtype, s_.who);
  });
}

void HostPipeline::sink_release(uint64_t ticket) {
#if TSR_PLUGIN_CUDA
  if (s_.cuda) {
    cudaEvent_t ev = sink_events_[ticket % sink_events_.size()];
    if (ev)
      cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s_.host->compute_stream), ev, 0),
                 s_.who, "wait for the gradients' copy");
  }
#endif
  (void)ticket;
}

double HostPipeline::sink_norm_sq() {
  wait_range(0, s_.n);  // nothing else uses the pool meanwhile
  if (!s_.cuda) {
    // The same op over the same array as a zero plugin's device slice: the
    // same bits, so clipping scales alike.
    int64_t n = static_cast<int64_t>(s_.n);
    DLTensor t = sdk::view(s_.grads_host, DLDevice{kDLCPU, 0}, s_.compute_dtype, 1, &n);
    double sq = 0;
    sdk::check(s_.host->ops->sum_squares(s_.host->ctx, &t, &sq));
    return sq;
  }
#if TSR_PLUGIN_CUDA
  cuda_check(cudaStreamSynchronize(copies_.d2h), s_.who, "copy gradients to the host");
#endif
  // Fixed chunks summed in order: the same value on every run.
  constexpr size_t kChunk = size_t{1} << 20;
  const size_t chunks = (s_.n + kChunk - 1) / kChunk;
  std::vector<double> part(chunks, 0.0);
  s_.pool->run(chunks, [&](size_t c) {
    double acc = 0;
    for (size_t i = c * kChunk, e = std::min(s_.n, i + kChunk); i < e; ++i) {
      const double x = element(s_.grads_pinned, i, s_.compute_dtype);
      acc += x * x;
    }
    part[c] = acc;
  });
  double sq = 0;
  for (double x : part) sq += x;
  return sq;
}

tsr_offload_stats HostPipeline::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  tsr_offload_stats out = sdk::make<tsr_offload_stats>();
  out.d2h_s = d2h_s_;
  out.host_s = host_s_;
  out.h2d_s = h2d_s_;
  out.elements = elements_;
  return out;
}

}  // namespace tessera::offload
