// offload cpu's `ratio`: a share of the owned state kept on the compute
// device and stepped there by the optimizer's device kernel, on the compute
// stream, while the host's threads step the rest. Owned elements
// [0, split) are the device's.
//
// A speculative round (TSR_EXT_OFFLOAD_SPECULATE) defers the share's steps
// until the verdict rather than undoing them: on the GPU they are short
// kernels on the compute stream, and deferring them keeps no copy of any
// state. resolve() then runs them with the verdict's scale (or drops them
// for a skip), the same calls a plain step makes, so the same bits.
//
// In a CPU run the compute device is the host: the share is stepped by the
// optimizer's CPU kernel on the calling thread, over the host arrays
// themselves, beside the dispatcher's threads (the same math, so the same
// bits; it exists so that the split is exercised where CI runs).
#pragma once

#include <chrono>
#include <cstdlib>
#include <string>

#include "offload_common.hpp"

namespace tessera::offload {

struct Ratio {
  bool automatic = false;
  double fraction = 0;
};

inline Ratio parse_ratio(const std::string &v, const char *who) {
  if (v == "auto") return {true, 0};
  char *end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !(x >= 0 && x <= 1))
    throw sdk::Error(TSR_ERR_CONFIG,
                     fmt("%s: ratio = \"%s\": expected the GPU's share of the optimizer state, "
                         "from \"0\" to \"1\", or \"auto\"",
                         who, v.c_str()));
  return {false, x};
}

class DeviceShare {
 public:
  void init(const tsr_host *host, const char *who, const tsr_offload_setup *st) {
    host_ = host;
    who_ = who;
    n_ = st->n;
    device_ = st->device;
    cuda_ = device_.device_type == kDLCUDA;
    dtype_ = st->compute_dtype;
    opt_ = st->optimizer;
    opt_self_ = st->optimizer_self;
    slots_ = 1 + st->state_count;
  }
  // The host's arrays, owned element 0 first (a fixed share copies its
  // start from them; a CPU run steps its share in them).
  void attach_host(float *const *host_slots) {
    for (uint32_t i = 0; i < slots_; ++i) host_slot_[i] = host_slots[i];
  }
  bool decided() const { return decided_; }
  size_t split() const { return split_; }
  double seconds() const { return seconds_; }

  // A fixed share (ratio = "0.3").
  void resize(double fraction) {
    resize_elems(static_cast<size_t>(fraction * static_cast<double>(n_)), true);
  }

  // ratio = "auto", once the first step has shown the peak: the largest
  // share whose state fits under the limit beside that peak, less a margin
  // for what a step allocates beyond the host's count (library workspaces).
  void choose_auto() {
    tsr_device_memory m = sdk::make<tsr_device_memory>();
    if (!device_memory(&m)) {
      decided_ = true;
      log(fmt("%s: ratio = \"auto\": all of the state stays on the host (%s)", who_,
              cuda_ ? "the host reports no device memory limit" : "a CPU run"));
      return;
    }
    const size_t margin = std::max<size_t>(size_t{1} << 30, m.limit / 20);
    const size_t budget = m.limit > m.peak + margin ? m.limit - m.peak - margin : 0;
    resize_elems(std::min(n_, budget / (4 * slots_)), true);
    log(
        fmt("%s: ratio = \"auto\" chose %.3f: %zu of %zu owned elements (%.2f GiB of state) on "
            "the GPU, beside step 1's peak of %.2f GiB under a limit of %.2f GiB",
            who_, n_ ? static_cast<double>(split_) / static_cast<double>(n_) : 0.0, split_, n_,
            gib(4.0 * slots_ * split_), gib(static_cast<double>(m.peak)),
            gib(static_cast<double>(m.limit))));
  }

  // ratio = "auto" where the host cannot hold all of the state, so the run
  // could not reach its first step: the share is chosen at start-up, from
  // what the device holds now (the weights, the gradients and the model's
  // activations are allocated by then), less a margin for what a step adds
  // on top (library workspaces, the loss's temporaries): a sixteenth of
  // the limit, at least 2 GiB. Its state starts at zero on the device; the
  // host's write_state brings the initial values. The host's arrays then
  // hold owned elements [split, n) only. Returns the split; 0, deciding
  // nothing, where the device reports no limit.
  size_t choose_at_start(double host_bytes, double host_need) {
    tsr_device_memory m = sdk::make<tsr_device_memory>();
    if (!device_memory(&m)) return 0;
    const size_t margin = std::max<size_t>(size_t{2} << 30, m.limit / 16);
    const size_t budget = m.limit > m.in_use + margin ? m.limit - m.in_use - margin : 0;
    resize_elems(std::min(n_, budget / (4 * slots_)), false);
    log(fmt(
        "%s: ratio = \"auto\" chose %.3f at start-up: the whole state needs %.2f GiB of host "
        "memory and %.2f GiB is available, so %zu of %zu owned elements (%.2f GiB of state) "
        "live on the GPU, beside the %.2f GiB allocated there now and a margin of %.2f GiB "
        "for the step, under a limit of %.2f GiB",
        who_, n_ ? static_cast<double>(split_) / static_cast<double>(n_) : 0.0, gib(host_need),
        gib(host_bytes), split_, n_, gib(4.0 * slots_ * split_), gib(static_cast<double>(m.in_use)),
        gib(static_cast<double>(margin)), gib(static_cast<double>(m.limit))));
    return split_;
  }
  // From now until resolve(), step() keeps what it is handed.
  void defer() {
    deferring_ = true;
    deferred_.clear();
  }
  // The verdict of a speculative round (extensions.h): the deferred steps
  // run, with grad_scale for a restep, or are dropped for a skip.
  void resolve(int32_t verdict, double grad_scale) {
    deferring_ = false;
    std::vector<Deferred> run = std::move(deferred_);
    deferred_.clear();
    if (verdict == TSR_SPECULATE_SKIP) return;
    for (Deferred &d : run) {
      d.st.segments = d.segments.data();
      if (verdict == TSR_SPECULATE_RESTEP) d.st.grad_scale = grad_scale;
      step(&d.st, d.begin, d.end);
    }
  }

  // Steps elements [begin, end) of `st` (relative to st->offset, all below
  // the split) where the share lives.
  void step(const tsr_offload_step *st, size_t begin, size_t end) {
    if (deferring_) {
      Deferred d{*st, std::vector<tsr_segment>(st->segments, st->segments + st->num_segments),
                 begin, end};
      deferred_.push_back(std::move(d));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const size_t off = st->offset + begin, cb = dtype_bytes(dtype_);
    std::vector<tsr_segment> segs;
    slice_segments(st->segments, st->num_segments, begin, end, segs);
    float *state[kMaxStates] = {};
    for (uint32_t i = 1; i < slots_; ++i) state[i - 1] = base(i) + off;
    auto a = sdk::make<tsr_optimizer_step_args>();
    a.device = device_;
    a.params = base(0) + off;
    a.grads = reinterpret_cast<const float *>(static_cast<const char *>(st->grads) + begin * cb);
    a.state = state;
    a.n = end - begin;
    a.segments = segs.data();
    a.num_segments = segs.size();
    a.lr = st->lr;
    a.grad_scale = st->grad_scale;
    a.step = st->step;
    a.compute_params = static_cast<char *>(st->params) + begin * cb;
    a.compute_dtype = dtype_;
    a.grads_dtype = dtype_;
    a.stream = cuda_ ? host_->compute_stream : nullptr;
    sdk::check(opt_->step(opt_self_, &a));
    if (!cuda_)  // queued only, on CUDA: its time shows in the GPU's
      seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void flush() {
    if (cuda_ && split_ > 0) sdk::check(host_->synchronize(host_->ctx));
  }

  // Copies the leading device-held elements of [offset, offset + count) of
  // `slot` to dst; returns how many (the rest are the host's).
  size_t read(uint32_t slot, size_t offset, size_t count, float *dst) {
    if (!cuda_ || offset >= split_ || slot >= slots_) return 0;
    const size_t k = std::min(count, split_ - offset);
    copy(dev_[slot].as<float>() + offset, device_, dst, DLDevice{kDLCPU, 0}, k);
    return k;
  }
  void write(uint32_t slot, size_t offset, size_t count, const float *src) {
    if (!cuda_ || offset >= split_ || slot >= slots_) return;
    const size_t k = std::min(count, split_ - offset);
    copy(const_cast<float *>(src), DLDevice{kDLCPU, 0}, dev_[slot].as<float>() + offset, device_,
         k);
  }

  std::string describe() const {
    if (!decided_) return "; ratio \"auto\": the GPU's share is chosen after the first step";
    if (split_ == 0) return "";
    return fmt("; %zu owned elements (%.1f%%, %.2f GiB of state) stepped on the %s", split_,
               100.0 * static_cast<double>(split_) / static_cast<double>(n_ ? n_ : 1),
               gib(4.0 * slots_ * split_), cuda_ ? "GPU" : "compute thread");
  }

 private:
  static double gib(double b) { return b / 1073741824.0; }
  float *base(uint32_t slot) const { return cuda_ ? dev_[slot].as<float>() : host_slot_[slot]; }
  void log(const std::string &msg) const { host_->log(host_->ctx, TSR_LOG_INFO, msg.c_str()); }
  void copy(float *src, DLDevice from, float *dst, DLDevice to, size_t count) {
    int64_t len = static_cast<int64_t>(count);
    DLTensor s = sdk::view(src, from, DLDataType{kDLFloat, 32, 1}, 1, &len);
    DLTensor d = sdk::view(dst, to, DLDataType{kDLFloat, 32, 1}, 1, &len);
    sdk::check(host_->ops->copy(host_->ctx, &s, &d));
  }
  // The run's device memory, where the host reports a limit (CUDA runs).
  bool device_memory(tsr_device_memory *m) const {
    return cuda_ && TSR_HAS_FIELD(host_, tsr_host, device_memory) && host_->device_memory &&
           host_->device_memory(host_->ctx, m) == TSR_OK && m->limit > 0;
  }
  // The device's arrays for [0, elems), starting from the host's values
  // (`from_host`) or from zeros (the host holds none of them).
  void resize_elems(size_t elems, bool from_host) {
    decided_ = true;
    split_ = elems / kAlignElems * kAlignElems;
    if (!cuda_ || split_ == 0) return;
    dev_.clear();
    int64_t len = static_cast<int64_t>(split_);
    for (uint32_t i = 0; i < slots_; ++i) {
      dev_.emplace_back(host_, device_, split_ * sizeof(float), TSR_MEM_OPTIMIZER);
      if (from_host) {
        copy(host_slot_[i], DLDevice{kDLCPU, 0}, dev_.back().as<float>(), device_, split_);
        continue;
      }
      DLTensor t = sdk::view(dev_.back().get(), device_, DLDataType{kDLFloat, 32, 1}, 1, &len);
      sdk::check(host_->ops->fill(host_->ctx, &t, 0.0f));
    }
  }

  const tsr_host *host_ = nullptr;
  const char *who_ = "offload";
  size_t n_ = 0, split_ = 0;
  DLDevice device_{};
  bool cuda_ = false, decided_ = false;
  DLDataType dtype_{};
  const tsr_optimizer_vtable *opt_ = nullptr;
  void *opt_self_ = nullptr;
  uint32_t slots_ = 1;
  float *host_slot_[1 + kMaxStates] = {};
  std::vector<sdk::Buffer> dev_;
  double seconds_ = 0;
  // A speculative round's steps, until its verdict (the step's pointers
  // stay valid until then: the host keeps the gradients until wait_grads).
  struct Deferred {
    tsr_offload_step st;
    std::vector<tsr_segment> segments;
    size_t begin = 0, end = 0;
  };
  bool deferring_ = false;
  std::vector<Deferred> deferred_;
};

}  // namespace tessera::offload
