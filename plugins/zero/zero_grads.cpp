// The zero plugin's gradients (zero_state.hpp): where backward accumulates
// them, their reduction in buckets during backward (an all-reduce at stages
// 0-1, a reduce-scatter at stages 2-3), which groups are final for an early
// update (ABI 1.10 take_final), the hand-over to an offload backend's
// gradient sink, and the norm over the reduced gradients. Parameters,
// layout and the update's re-share stay in zero_state.cpp.
#include <algorithm>
#include <string>

#include "zero_state.hpp"

namespace tessera::zero {

namespace {
// Reduce-scatter buckets a backward keeps in flight (stages 2-3).
constexpr size_t kScattersInFlight = 2;
// Reductions take_final leaves in flight: older ones it waits for, so
// their groups' updates can start during backward. (Stages 2-3 complete
// past kScattersInFlight as they launch, so this bound is already met.)
constexpr size_t kReducesInFlight = 2;
}  // namespace

using sdk::check;
using sdk::Error;

void *ZeroState::grads(uint32_t g) {
  if (g >= size_.size())
    throw Error(TSR_ERR_INVALID, "zero: group " + std::to_string(g) + " out of range");
  if (!training_) throw Error(TSR_ERR_INVALID, "zero: no gradients for a frozen model");
  if (frozen_[g])
    throw Error(TSR_ERR_INVALID,
                "zero: group " + std::to_string(g) + " is frozen: its parameters have no gradient");
  if (opt_.stage < 2) return at(grads_.get(), grad_offset_[g]);
  auto it = active_grads_.find(g);
  if (it != active_grads_.end()) return it->second.get();
  sdk::Buffer b = take(size_[g], TSR_MEM_COMM);
  DLTensor v = view(b.get(), size_[g]);
  check(host_->ops->fill(host_->ctx, &v, 0.f));
  void *p = b.get();
  active_grads_.emplace(g, std::move(b));
  return p;
}

void ZeroState::launch_bucket() {
  if (bucket_lo_ < 0) return;
  size_t lo = grad_offset_[static_cast<size_t>(bucket_lo_)];
  size_t hi =
      grad_offset_[static_cast<size_t>(bucket_hi_)] + size_[static_cast<size_t>(bucket_hi_)];
  DLTensor t = view(at(grads_.get(), lo), hi - lo);
  // Launched on the last micro-batch only: every group it holds is final
  // once it completes.
  Pending p;
  for (int64_t g = bucket_lo_; g <= bucket_hi_; ++g)
    if (!frozen_[static_cast<size_t>(g)]) p.finals.push_back(static_cast<uint32_t>(g));
  check(host_->comm->all_reduce(host_->ctx, &t, TSR_REDUCE_AVG, opt_.overlap ? &p.work : nullptr));
  if (p.work)
    pending_.push_back(std::move(p));
  else
    complete(p);
  bucket_lo_ = bucket_hi_ = -1;
}

void ZeroState::take_final(uint32_t *groups, size_t cap, size_t *n) {
  if (!n || (cap > 0 && !groups)) throw Error(TSR_ERR_INVALID, "zero: take_final without room");
  // Completed in launch order, as finish_grads would: the same sums.
  while (pending_.size() > kReducesInFlight) {
    Pending done = std::move(pending_.front());
    pending_.erase(pending_.begin());
    complete(done);
  }
  // With the gradient sink the backend holds the slices (copies still
  // landing): the host starts no update before finish_grads there.
  size_t k = 0;
  while (!sunk_ && k < cap && final_taken_ < final_.size()) groups[k++] = final_[final_taken_++];
  *n = k;
}

void ZeroState::grads_done(uint32_t g, bool last_micro) {
  if (g >= size_.size())
    throw Error(TSR_ERR_INVALID, "zero: group " + std::to_string(g) + " out of range");
  if (frozen_[g]) {  // no gradient: backward is only done with its parameters
    if (opt_.stage == 3) params_done(g);
    return;
  }
  if (opt_.stage < 2) {
    // Gradients accumulate locally over micro-batches; the sum crosses the
    // network once, in buckets of groups neighbouring in grads_ (frozen
    // groups between them have no gradient there).
    if (!last_micro || world_ == 1) return;
    if (declared_.size() != size_.size()) declared_.assign(size_.size(), 0);
    declared_[g] = 1;
    if (bucket_lo_ >= 0 &&
        grad_offset_[g] + size_[g] != grad_offset_[static_cast<size_t>(bucket_lo_)])
      launch_bucket();
    if (bucket_lo_ < 0) bucket_hi_ = g;
    bucket_lo_ = g;
    size_t lo = grad_offset_[static_cast<size_t>(bucket_lo_)];
    size_t hi =
        grad_offset_[static_cast<size_t>(bucket_hi_)] + size_[static_cast<size_t>(bucket_hi_)];
    if (static_cast<double>((hi - lo) * esize_) >= opt_.bucket_mb * 1048576.0) launch_bucket();
    return;
  }
  // Backward is done with group g's parameters.
  if (opt_.stage == 3) params_done(g);
  // Stages 2-3: finished groups collect in a bucket; a full bucket is
  // reduce-scattered at once, so only this rank's slices are kept.
  auto it = active_grads_.find(g);
  if (it == active_grads_.end()) return;  // the model produced no gradient for g
  scatter_bytes_ += size_[g] * esize_;
  scatter_bucket_.push_back({g, std::move(it->second), last_micro});
  active_grads_.erase(it);
  if (static_cast<double>(scatter_bytes_) >= opt_.bucket_mb * 1048576.0) launch_scatter_bucket();
}

sdk::Buffer ZeroState::take(size_t elems, tsr_mem_purpose purpose) {
  for (size_t i = 0; i < pool_.size(); ++i)
    if (pool_[i].bytes() >= elems * esize_) {
      sdk::Buffer b = std::move(pool_[i]);
      pool_.erase(pool_.begin() + static_cast<ptrdiff_t>(i));
      return b;
    }
  return sdk::Buffer(host_, device_, elems * esize_, purpose);
}

void ZeroState::give(sdk::Buffer b) {
  if (b.get()) pool_.push_back(std::move(b));
}

void ZeroState::launch_scatter_bucket() {
  if (scatter_bucket_.empty()) return;
  Pending p;
  size_t sum_per = 0;
  for (const Finished &f : scatter_bucket_) sum_per += per(f.group);
  // Pack rank-major: rank q's slices of every group in the bucket, in a row,
  // so one reduce-scatter hands each rank exactly its slices.
  p.packed = take(sum_per * world_, TSR_MEM_COMM);
  p.reduced = take(sum_per, TSR_MEM_COMM);
  for (uint32_t q = 0; q < world_; ++q) {
    size_t off = q * sum_per;
    for (const Finished &f : scatter_bucket_) {
      const size_t n = per(f.group);
      DLTensor src = view(at(f.grads.get(), q * n), n);
      DLTensor dst = view(at(p.packed.get(), off), n);
      check(host_->ops->copy(host_->ctx, &src, &dst));
      off += n;
    }
  }
  for (Finished &f : scatter_bucket_) {
    p.groups.push_back(f.group);
    if (f.last) p.finals.push_back(f.group);
    give(std::move(f.grads));
  }
  scatter_bucket_.clear();
  scatter_bytes_ = 0;
  DLTensor in = view(p.packed.get(), sum_per * world_);
  DLTensor out = view(p.reduced.get(), sum_per);
  check(host_->comm->reduce_scatter(host_->ctx, &in, &out, TSR_REDUCE_AVG,
                                    opt_.overlap ? &p.work : nullptr));
  pending_.push_back(std::move(p));
  // A bounded number in flight: each holds a packed and a reduced copy of
  // its bucket, and a large model's backward would otherwise keep all of
  // them until finish_grads (under stage 3 with offloaded parameters, more
  // than the gradients themselves). Completed in launch order, as
  // finish_grads would: the same sums.
  while (opt_.overlap && pending_.size() > kScattersInFlight) {
    Pending done = std::move(pending_.front());
    pending_.erase(pending_.begin());
    complete(done);
  }
  if (!opt_.overlap) {
    Pending done = std::move(pending_.back());
    pending_.pop_back();
    complete(done);
  }
}

void ZeroState::complete(Pending &p) {
  if (p.work) {
    tsr_comm_work *w = p.work;
    p.work = nullptr;
    check(host_->comm->wait(host_->ctx, w));
  }
  // At stages 2-3 the axpy below is queued on the compute stream before the
  // host hears of these groups, so a backend's copy after it reads the sum.
  final_.insert(final_.end(), p.finals.begin(), p.finals.end());
  if (opt_.stage >= 2 && p.reduced.get() && sunk_) {
    // This micro-batch's averaged slices leave the device; the buffer
    // returns to the pool once the copies have read it (two may drain).
    size_t off = 0;
    for (uint32_t g : p.groups) {
      sink_put(g, at(p.reduced.get(), off));
      off += per(g);
    }
    give(std::move(p.packed));
    draining_.emplace_back(std::move(p.reduced), last_ticket_);
    release_drained(kScattersInFlight);
  } else if (opt_.stage >= 2 && p.reduced.get()) {
    // This micro-batch's averaged slices add into the owned gradients.
    size_t off = 0;
    for (uint32_t g : p.groups) {
      DLTensor src = view(at(p.reduced.get(), off), per(g));
      DLTensor dst = view(at(grads_.get(), owned_offset_[g]), per(g));
      check(host_->ops->axpy(host_->ctx, 1.f, &src, &dst));
      off += per(g);
    }
    give(std::move(p.packed));
    give(std::move(p.reduced));
  }
}

void ZeroState::finish_grads() {
  // Groups the model touched but never declared done are reduced now.
  if (opt_.stage >= 2) {
    std::vector<uint32_t> left;
    for (auto &[g, b] : active_grads_) left.push_back(g);
    for (uint32_t g : left) grads_done(g, true);
  }
  // Stages 0-1: a group the model never declared done is reduced too, or
  // the ranks would drift apart.
  if (opt_.stage < 2 && world_ > 1) {
    if (declared_.size() != size_.size()) declared_.assign(size_.size(), 0);
    for (uint32_t g = static_cast<uint32_t>(size_.size()); g-- > 0;)
      if (!declared_[g] && !frozen_[g]) grads_done(g, true);
    declared_.assign(size_.size(), 0);
  }
  launch_bucket();
  launch_scatter_bucket();
  std::vector<Pending> pending;
  pending.swap(pending_);
  for (auto &p : pending) complete(p);
  if (sunk_) finish_sink();
  // Every group is final now; the host starts what take_final did not
  // report, and the next step reports afresh.
  final_.clear();
  final_taken_ = 0;
}

// A group no micro-batch produced a gradient for still owes the sink its
// zeros (a device slice would have been cleared); then every buffer the
// copies read comes back.
void ZeroState::finish_sink() {
  for (uint32_t g = 0; g < size_.size(); ++g) {
    if (filled_[g] || per(g) == 0 || frozen_[g]) continue;
    sdk::Buffer z = take(per(g), TSR_MEM_COMM);
    DLTensor v = view(z.get(), per(g));
    check(host_->ops->fill(host_->ctx, &v, 0.f));
    sink_put(g, z.get());
    draining_.emplace_back(std::move(z), last_ticket_);
  }
  release_drained(0);
}

double ZeroState::grad_norm_sq() {
  double sq = 0;
  if (!sunk_ && opt_.stage < 2) {
    // Every rank holds the whole averaged gradient: no communication.
    DLTensor t = view(grads_.get(), grad_total_);
    check(host_->ops->sum_squares(host_->ctx, &t, &sq));
    return sq;
  }
  // Stages 2-3: this rank's owned slice (held by the sink where it took
  // them), summed over the ranks.
  if (sunk_) {
    check(sink_.norm_sq(sink_.self, &sq));
  } else {
    DLTensor t = view(grads_.get(), owned_total_);
    check(host_->ops->sum_squares(host_->ctx, &t, &sq));
  }
  if (world_ == 1) return sq;
  double buf = sq;
  int64_t one = 1;
  DLTensor d = sdk::view(&buf, DLDevice{kDLCPU, 0}, DLDataType{kDLFloat, 64, 1}, 1, &one);
  check(host_->comm->all_reduce(host_->ctx, &d, TSR_REDUCE_SUM, nullptr));
  return buf;
}

// Group g's reduced slice (this micro-batch's average) to the sink: the
// step's first contribution replaces what it holds, later ones add.
void ZeroState::sink_put(uint32_t g, const void *src) {
  uint64_t ticket = 0;
  check(sink_.put(sink_.self, owned_offset_[g], per(g), src, filled_[g] ? 1 : 0, &ticket));
  filled_[g] = 1;
  last_ticket_ = ticket;
}

// Buffers the sink's copies read go back to the pool once the compute
// stream is ordered after those copies; `keep` of the newest may stay out.
void ZeroState::release_drained(size_t keep) {
  while (draining_.size() > keep) {
    check(sink_.release(sink_.self, draining_.front().second));
    give(std::move(draining_.front().first));
    draining_.erase(draining_.begin());
  }
}

}  // namespace tessera::zero
