// The overlapped host update (pipeline.hpp).
#include "pipeline.hpp"

#include <chrono>

namespace tessera::offload {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

HostPipeline::HostPipeline(const PipelineSetup &s) : s_(s) {
  GradSinkSetup g;
  g.host = s_.host;
  g.who = s_.who;
  g.n = s_.n;
  g.dtype = s_.compute_dtype;
  g.data = s_.cuda ? s_.grads_pinned : s_.grads_host;
  g.cuda = s_.cuda;
  g.pool = s_.pool;
#if TSR_PLUGIN_CUDA
  if (s_.cuda) copies_.init(s_.who);
  g.copies = &copies_;
#endif
  sink_.init(g);
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
  // The add runs on the pool, which must be free of updates: a later
  // micro-batch's backward follows a whole forward, which waited for every
  // range's update, so this returns at once; it is the guarantee.
  if (add) wait_range(0, s_.n);
  return sink_.put(offset, count, src, add);
}

void HostPipeline::sink_release(uint64_t ticket) {
  sink_.release(ticket);
}

double HostPipeline::sink_norm_sq() {
  wait_range(0, s_.n);  // nothing else uses the pool meanwhile
  return sink_.norm_sq();
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
