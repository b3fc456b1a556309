// The overlapped host update (pipeline.hpp).
#include "pipeline.hpp"

#include <algorithm>
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
  Job j;
  j.u = std::move(u);
  j.spec = spec_open_;
  push(std::move(j), true);
  lk.unlock();
  work_.notify_one();
}

// Appends a job (under mu_). In a CUDA run its gradients' copy to the host
// goes first, unless `copy_grads` is false (a fix job reads what its
// original's copy brought).
void HostPipeline::push(Job j, bool copy_grads) {
#if TSR_PLUGIN_CUDA
  if (s_.cuda) {
    const size_t k = jobs_.size();
    // Ordered after what the compute stream has queued so far: the backward
    // that produced these gradients (and, when the range comes during
    // backward, its use of the range's parameters before it said so).
    if (copy_grads) copies_.after_compute(s_.host->compute_stream);
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
    if (copy_grads && j.u.grads)
      cuda_check(cudaMemcpyAsync(s_.grads_pinned + (j.u.offset - s_.first) * cb, j.u.grads,
                                 j.u.count * cb, cudaMemcpyDeviceToHost, copies_.d2h),
                 s_.who, "copy gradients to the host");
    cuda_check(cudaEventRecord(ev[1], copies_.d2h), s_.who, "record");
  }
#else
  (void)copy_grads;
#endif
  pos_.push_back(order_.size());
  order_.push_back(jobs_.size());
  jobs_.push_back(std::move(j));
}

void HostPipeline::serve() {
#if TSR_PLUGIN_CUDA
  if (s_.cuda) (void)cudaSetDevice(s_.device);  // copies from this thread go to the run's GPU
#endif
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_.wait(lk, [&] { return stop_ || next_ < order_.size(); });
    if (stop_) return;
    take_landed();
    const size_t k = order_[next_];
    Job &j = jobs_[k];
    // Held for the verdict: look again, the order may have changed since.
    if (!admit(j, lk)) continue;
    ++next_;
    void *events = nullptr, *of_events = nullptr;
#if TSR_PLUGIN_CUDA
    if (s_.cuda) {
      events = &events_[k];
      of_events = &events_[j.of];
    }
#endif
    lk.unlock();
    process(j, k, events, of_events);
    lk.lock();
    host_s_ += j.host_s;
    if (!j.skip) elements_ += j.u.count;
    spec_.save_s += j.save_s;
    if (j.fix) spec_.redo_s += j.host_s;
    j.done = true;
    done_.notify_all();
  }
}

// Decides how the dispatcher runs job j, the next in order (under mu_,
// which it may release while it waits): a range of an open speculative
// round is stepped ahead where the undo space has room for its pre-step
// values; else the dispatcher waits for the verdict and returns false, to
// take whatever is first by then. Once the verdict is known, a range not
// yet stepped takes its scale (or is skipped).
bool HostPipeline::admit(Job &j, std::unique_lock<std::mutex> &lk) {
  if (!j.spec) return true;
  if (!verdict_known_) {
    const UndoLayout l{j.u.count, s_.state_count, may_skip_ ? dtype_bytes(s_.compute_dtype) : 0};
    if (undo_used_ + l.bytes() <= round_undo_bytes_) {
      j.undo = undo_used_;
      undo_used_ += l.bytes();
      return true;
    }
    const auto t0 = std::chrono::steady_clock::now();
    holding_ = next_;
    done_.notify_all();  // a wait for this range now fails rather than hangs (wait_done)
    work_.wait(lk, [&] { return stop_ || verdict_known_; });
    holding_ = kNoUndo;
    spec_.held_s += seconds_since(t0);
    return false;
  }
  if (verdict_ == TSR_SPECULATE_RESTEP) j.u.grad_scale = verdict_scale_;
  j.skip = verdict_ == TSR_SPECULATE_SKIP;
  return true;
}

// Puts the jobs not yet taken in the order the last step's forward asked
// for their ranges (under mu_); ranges it did not ask for keep their order,
// after the others. Once per step: the order does not change within one.
void HostPipeline::order_as_demanded() {
  if (ordered_ || next_ >= order_.size() || last_demanded_.empty()) return;
  ordered_ = true;
  // Each pending job's place in that order, looked up once (under the
  // lock the dispatcher waits on): last_demanded_.size() where not asked for.
  std::vector<size_t> rank(jobs_.size());
  for (size_t p = next_; p < order_.size(); ++p)
    rank[order_[p]] = static_cast<size_t>(
        std::find(last_demanded_.begin(), last_demanded_.end(), jobs_[order_[p]].u.offset) -
        last_demanded_.begin());
  std::stable_sort(order_.begin() + static_cast<std::ptrdiff_t>(next_), order_.end(),
                   [&](size_t a, size_t b) { return rank[a] < rank[b]; });
  for (size_t p = next_; p < order_.size(); ++p) pos_[order_[p]] = p;
}

// The host waits for job k (under mu_): if it has not started it goes
// next; a wait for its parameters (the next forward's) is noted for the
// next step's order.
void HostPipeline::demand(size_t k, bool params) {
  Job &j = jobs_[k];
  if (params && !j.demanded && !j.fix) {
    j.demanded = true;
    demanded_.push_back(j.u.offset);
  }
  move_up(pos_[k]);
}

// The job at position p goes next (under mu_), unless it has started.
void HostPipeline::move_up(size_t p) {
  if (p <= next_ || p >= order_.size()) return;
  std::rotate(order_.begin() + static_cast<std::ptrdiff_t>(next_),
              order_.begin() + static_cast<std::ptrdiff_t>(p),
              order_.begin() + static_cast<std::ptrdiff_t>(p) + 1);
  for (size_t q = next_; q <= p; ++q) pos_[order_[q]] = q;
}

// In a CUDA run, the first job in order whose gradients have reached the
// host goes next (under mu_); if none has, the one whose copy was queued
// first. The order wants the first layer first, but its gradients are the
// last to land: waiting for them while other ranges are in would leave the
// CPU idle. Every job records its copy's end on the one copy stream in the
// order the jobs came, so the jobs landed are a prefix of jobs_: landed_
// only grows, and each event is asked about until it has.
void HostPipeline::take_landed() {
#if TSR_PLUGIN_CUDA
  if (!s_.cuda) return;
  while (landed_ < jobs_.size() && cudaEventQuery(events_[landed_][1]) == cudaSuccess) ++landed_;
  (void)cudaGetLastError();  // not ready is no error; a failed copy is the job's to report
  size_t earliest = next_;
  for (size_t p = next_; p < order_.size(); ++p) {
    if (order_[p] < landed_) return move_up(p);
    if (order_[p] < order_[earliest]) earliest = p;
  }
  move_up(earliest);
#endif
}

// The host update of job j's range: its master, state, gradients and where
// its compute parameters go.
HostUpdate HostPipeline::update_of(const Job &j) const {
  const RangeUpdate &r = j.u;
  const size_t cb = dtype_bytes(s_.compute_dtype);
  const size_t at = r.offset - s_.first;  // in the host's arrays
  HostUpdate u;
  u.master = s_.slots[0] + at;
  u.state_count = s_.state_count;
  for (uint32_t i = 0; i < s_.state_count; ++i) u.state[i] = s_.slots[1 + i] + at;
  u.owned = r.offset;
  u.count = r.count;
  u.segments = r.segments.data();
  u.num_segments = r.segments.size();
  u.lr = r.lr;
  u.grad_scale = r.grad_scale;
  u.step = r.step;
  u.grads_dtype = s_.compute_dtype;
  u.out_dtype = s_.compute_dtype;
  u.grads = r.grads ? r.grads : s_.grads_host + at * cb;
  u.params_out = r.params;
  if (s_.cuda) {
    u.grads = s_.grads_pinned + at * cb;
    u.params_out = s_.params_pinned + at * cb;
  }
  if (s_.params_home) u.params_out = s_.params_home + at * cb;
  return u;
}

// One range, on the dispatcher thread. Failures are kept with the job and
// raised on the thread that waits for it.
void HostPipeline::process(Job &j, size_t, void *events, void *of_events) {
  const RangeUpdate &r = j.u;
  const HostUpdate u = update_of(j);
  const UndoLayout undo{r.count, s_.state_count, may_skip_ ? dtype_bytes(s_.compute_dtype) : 0};
#if TSR_PLUGIN_CUDA
  const size_t cb = dtype_bytes(s_.compute_dtype);
  auto &ev = *static_cast<std::array<cudaEvent_t, 4> *>(events);
  if (s_.cuda) {
    // A fix job rewrites the pinned parameters its original's upload reads.
    cudaEvent_t first = j.fix ? (*static_cast<std::array<cudaEvent_t, 4> *>(of_events))[3] : ev[1];
    if (cudaEventSynchronize(first) != cudaSuccess || cudaEventSynchronize(ev[1]) != cudaSuccess) {
      j.status = TSR_ERR_INTERNAL;
      j.error =
          std::string("copy of gradients to the host: ") + cudaGetErrorString(cudaGetLastError());
      return;
    }
  }
#else
  (void)events;
  (void)of_events;
#endif
  const auto t0 = std::chrono::steady_clock::now();
  if (j.fix) restore_from_undo(*s_.pool, u, undo, s_.undo + j.undo);
  if (j.skip)
    j.status = TSR_OK;
  else if (j.undo != kNoUndo && !j.fix)
    j.status =
        run_update_saving(*s_.pool, s_.opt, s_.opt_self, u, undo, s_.undo + j.undo, &j.save_s);
  else
    j.status = run_update(*s_.pool, s_.opt, s_.opt_self, u);
  j.host_s = seconds_since(t0);
  if (j.status != TSR_OK) {
    j.error = "the optimizer's CPU step failed";
    return;
  }
#if TSR_PLUGIN_CUDA
  // A skipped range that was never stepped changed nothing on the host:
  // its upload is only the two events, so waits for it stay in order.
  const bool upload = !(j.skip && !j.fix);
  if (s_.cuda && !s_.params_home) {
    cudaError_t e = cudaEventRecord(ev[2], copies_.h2d);
    if (e == cudaSuccess && upload)
      e = cudaMemcpyAsync(r.params, s_.params_pinned + (r.offset - s_.first) * cb, r.count * cb,
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
  // A range at or after the position the dispatcher holds for the verdict
  // cannot finish before spec_resolve: say so instead of waiting for ever.
  auto stuck = [&] { return !verdict_known_ && holding_ <= pos_[k]; };
  done_.wait(lk, [&] { return jobs_[k].done || stuck(); });
  if (!jobs_[k].done)
    throw sdk::Error(TSR_ERR_INTERNAL,
                     fmt("%s: waited for owned elements [%zu, %zu), held for the verdict of a "
                         "speculative step: the host must resolve the speculation first",
                         s_.who, jobs_[k].u.offset, jobs_[k].u.offset + jobs_[k].u.count));
  if (jobs_[k].status != TSR_OK) raise(jobs_[k]);
}

std::vector<size_t> HostPipeline::overlapping(size_t offset, size_t count, bool params) {
  std::vector<size_t> ks;
  if (params) order_as_demanded();
  for (size_t k = 0; k < jobs_.size(); ++k) {
    const RangeUpdate &r = jobs_[k].u;
    if (r.offset >= offset + count || r.offset + r.count <= offset) continue;
    demand(k, params);
    ks.push_back(k);
  }
  return ks;
}

void HostPipeline::wait_range(size_t offset, size_t count) {
  std::unique_lock<std::mutex> lk(mu_);
  for (size_t k : overlapping(offset, count, false)) wait_done(k, lk);
}

void HostPipeline::wait_params(size_t offset, size_t count) {
  std::unique_lock<std::mutex> lk(mu_);
  for (size_t k : overlapping(offset, count, true)) {
    wait_done(k, lk);
#if TSR_PLUGIN_CUDA
    // Offloaded parameters go to the device only when fetched, after this.
    if (s_.cuda && !s_.params_home)
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
    // Uploads queue in the order the jobs ran: the last position's is last.
    if (!s_.params_home)
      cuda_check(cudaEventSynchronize(events_[order_.back()][3]), s_.who, "upload");
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
  order_.clear();
  pos_.clear();
  next_ = 0;
  landed_ = 0;
  ordered_ = false;
  if (!demanded_.empty()) last_demanded_.swap(demanded_);
  demanded_.clear();
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

void HostPipeline::set_undo(char *undo, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  if (spec_open_ || undo_used_ > 0)
    throw sdk::Error(TSR_ERR_INTERNAL,
                     fmt("%s: the undo space changed while a speculative round used it", s_.who));
  s_.undo = undo;
  s_.undo_bytes = bytes;
}

void HostPipeline::spec_begin(bool may_skip) {
  // The last round's fix jobs are done (they use the undo space); so is
  // every range of the last step, as at any new step.
  if (!jobs_.empty()) retire();
  std::lock_guard<std::mutex> lk(mu_);
  spec_open_ = true;
  may_skip_ = may_skip;
  verdict_known_ = false;
  verdict_ = TSR_SPECULATE_KEEP;
  verdict_scale_ = 1;
  undo_used_ = 0;
  round_undo_bytes_ = s_.adaptive && last_verdict_ != TSR_SPECULATE_KEEP ? 0 : s_.undo_bytes;
}

void HostPipeline::spec_resolve(int32_t verdict, double grad_scale) {
  if (verdict != TSR_SPECULATE_KEEP && verdict != TSR_SPECULATE_RESTEP &&
      verdict != TSR_SPECULATE_SKIP)
    throw sdk::Error(TSR_ERR_INVALID, fmt("%s: speculation verdict %d is none of keep (0), "
                                          "restep (1), skip (2)",
                                          s_.who, static_cast<int>(verdict)));
  std::unique_lock<std::mutex> lk(mu_);
  if (!spec_open_)
    throw sdk::Error(TSR_ERR_INVALID, fmt("%s: speculation resolved without begin", s_.who));
  if (s_.worst_case)
    done_.wait(lk, [&] {
      for (size_t k = 0; k < jobs_.size(); ++k)
        if (!jobs_[k].done && holding_ > pos_[k]) return false;  // the verdict is not known yet
      return true;
    });
  if (verdict == TSR_SPECULATE_SKIP && !may_skip_)
    throw sdk::Error(TSR_ERR_INVALID,
                     fmt("%s: speculation resolved as skip, but begun without "
                         "TSR_SPECULATE_MAY_SKIP (the compute parameters were not kept)",
                         s_.who));
  spec_open_ = false;
  verdict_known_ = true;  // a held range is held no longer, though the dispatcher may not know yet
  verdict_ = verdict;
  verdict_scale_ = grad_scale;
  last_verdict_ = verdict;
  ++spec_.steps;
  bool any = false;
  if (verdict != TSR_SPECULATE_KEEP) {
    const size_t end = jobs_.size();
    for (size_t k = 0; k < end; ++k) {
      const Job &o = jobs_[k];
      if (!o.spec || o.undo == kNoUndo) continue;  // not stepped ahead: takes the verdict
      Job f;
      f.u = o.u;
      f.u.grad_scale = grad_scale;
      f.fix = true;
      f.skip = verdict == TSR_SPECULATE_SKIP;
      f.undo = o.undo;
      f.of = k;
      spec_.elements_redone += o.u.count;
      push(std::move(f), false);
      any = true;
    }
  }
  if (any) ++(verdict == TSR_SPECULATE_SKIP ? spec_.restored : spec_.redone);
  // Every range of the step is in (the norm needed them all): what is left,
  // held ranges and redos alike, goes in the next forward's order.
  order_as_demanded();
  lk.unlock();
  work_.notify_all();
}

tsr_speculate_stats HostPipeline::spec_stats() {
  std::lock_guard<std::mutex> lk(mu_);
  tsr_speculate_stats out = spec_;
  out.struct_size = tsr_speculate_stats_STRUCT_SIZE;
  return out;
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
