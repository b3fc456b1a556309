#include "zero_state.hpp"

#include <algorithm>
#include <string>

namespace tessera::zero {

namespace {
// Reduce-scatter buckets a backward keeps in flight (stages 2-3).
constexpr size_t kScattersInFlight = 2;
// All-reduce buckets take_final leaves in flight (stages 0-1): older ones
// it waits for, so their groups' updates can start during backward.
constexpr size_t kReducesInFlight = 2;
}  // namespace

using sdk::check;
using sdk::Error;

ZeroState::~ZeroState() {
  // Reductions still in flight reference our buffers: let them land.
  for (auto &p : pending_)
    if (p.work) host_->comm->wait(host_->ctx, p.work);
  for (auto &[g, l] : live_)
    if (l.work) host_->comm->wait(host_->ctx, l.work);
}

void ZeroState::plan(tsr_zero_plan *out) const {
  // The host sized the struct; fill only what it has room for.
  if (TSR_HAS_FIELD(out, tsr_zero_plan, partition_optimizer))
    out->partition_optimizer = opt_.stage >= 1;
  if (TSR_HAS_FIELD(out, tsr_zero_plan, partition_grads)) out->partition_grads = opt_.stage >= 2;
  if (TSR_HAS_FIELD(out, tsr_zero_plan, partition_params)) out->partition_params = opt_.stage >= 3;
}

void ZeroState::use_source(const tsr_param_source *src) {
  if (opt_.stage < 3)
    throw Error(TSR_ERR_INVALID,
                "zero stage" + std::to_string(opt_.stage) +
                    " keeps every parameter on every rank's device, so the offload backend cannot "
                    "hold them: parameter offload needs ZeRO stage 3 ([zero] plugin = \"stage3\"; "
                    "DeepSpeed's offload_param needs \"stage\": 3 too)");
  if (!src || src->struct_size < tsr_param_source_STRUCT_SIZE || !src->fetch || !src->ready)
    throw Error(TSR_ERR_INVALID, "zero: the parameter source is missing or too small");
  source_ = *src;
  sourced_ = true;
}

void ZeroState::use_sink(const tsr_grad_sink *sink) {
  if (opt_.stage < 2)
    throw Error(TSR_ERR_INVALID, "zero stage" + std::to_string(opt_.stage) +
                                     " keeps every gradient on every rank: only stages 2-3 can "
                                     "hand their reduced slices to the offload backend");
  if (!sink || sink->struct_size < tsr_grad_sink_STRUCT_SIZE || !sink->put || !sink->release ||
      !sink->norm_sq)
    throw Error(TSR_ERR_INVALID, "zero: the gradient sink is missing or too small");
  sink_ = *sink;
  sunk_ = true;
}

void ZeroState::set_frozen(const int32_t *group_frozen, size_t num_groups) {
  if (num_groups > 0 && !group_frozen)
    throw Error(TSR_ERR_INVALID, "zero: frozen groups given without their flags");
  frozen_.assign(group_frozen, group_frozen + num_groups);
}

void ZeroState::frozen_ranges(tsr_range_fn fn, void *ctx) {
  for (uint32_t g = 0; g < size_.size(); ++g) {
    if (!frozen_[g]) continue;
    tsr_owned_range r = sdk::make<tsr_owned_range>();
    const bool sliced = opt_.stage == 3;
    r.flat_offset = sliced ? offset_[g] + rank_ * per(g) : offset_[g];
    r.count = sliced ? per(g) : size_[g];
    r.params = sliced ? at(params_.get(), kept_offset_[g]) : at(params_.get(), offset_[g]);
    check(fn(ctx, &r));
  }
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

DLTensor ZeroState::view(void *data, size_t count) {
  int64_t *shape = &shapes_[next_shape_++ % 8];
  *shape = static_cast<int64_t>(count);
  return sdk::view(data, device_, dtype_, 1, shape);
}

void ZeroState::setup(const tsr_zero_setup *s) {
  rank_ = host_->run->rank;
  world_ = host_->run->world_size;
  device_ = s->device;
  dtype_ = s->dtype;
  esize_ = (dtype_.bits * dtype_.lanes + 7) / 8;
  offset_.assign(s->group_offset, s->group_offset + s->num_groups);
  size_.assign(s->group_size, s->group_size + s->num_groups);
  total_ = s->total;
  for (size_t g = 0; g < size_.size(); ++g)
    if (size_[g] % world_ != 0)
      throw Error(TSR_ERR_INVALID, "zero: group " + std::to_string(g) + " size " +
                                       std::to_string(size_[g]) +
                                       " is not a multiple of the world size");
  if (frozen_.empty()) frozen_.assign(size_.size(), 0);
  if (frozen_.size() != size_.size())
    throw Error(TSR_ERR_INVALID, "zero: frozen flags for " + std::to_string(frozen_.size()) +
                                     " groups, the layout has " + std::to_string(size_.size()));
  place_groups();
  DLDevice host_mem{kDLCPU, 0};
  auto upload = [&](void *dst, const void *src, size_t count) {
    // Initial values come from host memory; copy through the ops so the
    // destination may live on a device.
    int64_t n = static_cast<int64_t>(count);
    DLTensor from = sdk::view(const_cast<void *>(src), host_mem, dtype_, 1, &n);
    DLTensor to = view(dst, count);
    check(host_->ops->copy(host_->ctx, &from, &to));
  };
  if (opt_.stage < 3) {
    params_ = sdk::Buffer(host_, device_, total_ * esize_, TSR_MEM_PARAMS);
    upload(params_.get(), s->initial_params, total_);
  } else if (kept_total_ > 0) {
    params_ = sdk::Buffer(host_, device_, kept_total_ * esize_, TSR_MEM_PARAMS);
    for (uint32_t g = 0; g < size_.size(); ++g)
      if (kept_offset_[g] != kNotKept)
        upload(
            at(params_.get(), kept_offset_[g]),
            static_cast<const char *>(s->initial_params) + (offset_[g] + rank_ * per(g)) * esize_,
            per(g));
  }
  training_ = s->training != 0;
  if (!s->training) return;  // a frozen model keeps no gradients
  if (sunk_) {
    filled_.assign(size_.size(), 0);
    return;  // the sink holds them
  }
  size_t grad_elems = opt_.stage < 2 ? grad_total_ : owned_total_;
  grads_ = sdk::Buffer(host_, device_, grad_elems * esize_, TSR_MEM_GRADS);
  DLTensor gv = view(grads_.get(), grad_elems);
  check(host_->ops->fill(host_->ctx, &gv, 0.f));
}

// Where each group's owned elements, gradients (stages 0-1) and kept
// parameter slice (stage 3) go: frozen groups own nothing and have no
// gradient; a parameter source holds the trainable slices.
void ZeroState::place_groups() {
  owned_offset_.assign(size_.size(), 0);
  grad_offset_.assign(size_.size(), 0);
  kept_offset_.assign(size_.size(), kNotKept);
  owned_total_ = grad_total_ = kept_total_ = 0;
  for (uint32_t g = 0; g < size_.size(); ++g) {
    owned_offset_[g] = owned_total_;
    grad_offset_[g] = grad_total_;
    if (!frozen_[g]) {
      // Everything for stage 0, slice `rank` of each group otherwise.
      owned_total_ += opt_.stage == 0 ? size_[g] : per(g);
      grad_total_ += size_[g];
    }
    if (opt_.stage == 3 && (frozen_[g] || !sourced_)) {
      kept_offset_[g] = kept_total_;
      kept_total_ += per(g);
    }
  }
}

void ZeroState::ranges(tsr_range_fn fn, void *ctx) {
  for (uint32_t g = 0; g < size_.size(); ++g) {
    if (frozen_[g]) continue;
    tsr_owned_range r = sdk::make<tsr_owned_range>();
    r.owned_offset = owned_offset_[g];
    r.flat_offset = opt_.stage == 0 ? offset_[g] : offset_[g] + rank_ * per(g);
    r.count = opt_.stage == 0 ? size_[g] : per(g);
    switch (opt_.stage) {
      case 0:
        r.grads = at(grads_.get(), grad_offset_[g]);
        break;
      case 1:
        r.grads = at(grads_.get(), grad_offset_[g] + rank_ * per(g));
        break;
      default:  // the sink's: the backend reads its own copy
        r.grads = sunk_ ? nullptr : at(grads_.get(), r.owned_offset);
        break;
    }
    // Offloaded parameters: the backend writes its own copy.
    r.params = sourced_         ? nullptr
               : opt_.stage < 3 ? at(params_.get(), r.flat_offset)
                                : at(params_.get(), kept_offset_[g]);
    check(fn(ctx, &r));
  }
}

// ---- parameters -----------------------------------------------------------

void ZeroState::gather(uint32_t g) {
  // Stage 3: all-gather group g's slices into a full-size buffer.
  Live &l = live_[g];
  // Reuse a released buffer of exactly this group's size; otherwise make
  // one. A larger spare is not borrowed: the group it fits may be gathered
  // next and would then need a fresh one, doubling the live memory.
  size_t found = spare_.size();
  for (size_t i = 0; i < spare_.size(); ++i)
    if (spare_[i].bytes() == size_[g] * esize_) found = i;
  if (found < spare_.size()) {
    l.buf = std::move(spare_[found]);
    spare_.erase(spare_.begin() + static_cast<ptrdiff_t>(found));
  } else {
    l.buf = sdk::Buffer(host_, device_, size_[g] * esize_, TSR_MEM_PARAMS);
  }
  if (sourced_ && !frozen_[g]) {
    fetch(g, l);
    return;
  }
  DLTensor in = view(at(params_.get(), kept_offset_[g]), per(g));
  DLTensor out = view(l.buf.get(), size_[g]);
  check(host_->comm->all_gather(host_->ctx, &in, &out, opt_.prefetch ? &l.work : nullptr));
}

void ZeroState::fetch(uint32_t g, Live &l) {
  // The owned slice comes from where the offload backend keeps it. One
  // rank owns the whole group: it lands in the group's buffer directly, and
  // the compute stream waits for it only at first use (wait_live), so the
  // copy of the next group runs while this one computes. Several ranks: the
  // slice lands in a staging buffer the all-gather then reads, ordered
  // after the copy on the compute stream.
  if (world_ == 1) {
    check(source_.fetch(source_.self, owned_offset_[g], per(g), l.buf.get(), &l.ticket));
    l.fetching = true;
    return;
  }
  l.staged = take(per(g), TSR_MEM_COMM);
  uint64_t ticket = 0;
  check(source_.fetch(source_.self, owned_offset_[g], per(g), l.staged.get(), &ticket));
  check(source_.ready(source_.self, ticket));
  DLTensor in = view(l.staged.get(), per(g));
  DLTensor out = view(l.buf.get(), size_[g]);
  check(host_->comm->all_gather(host_->ctx, &in, &out, opt_.prefetch ? &l.work : nullptr));
}

void ZeroState::wait_live(Live &l) {
  if (l.fetching) {
    l.fetching = false;
    check(source_.ready(source_.self, l.ticket));
  }
  if (l.work) {
    tsr_comm_work *w = l.work;
    l.work = nullptr;
    check(host_->comm->wait(host_->ctx, w));
  }
  give(std::move(l.staged));
}

void *ZeroState::params(uint32_t g, bool backward) {
  if (g >= size_.size())
    throw Error(TSR_ERR_INVALID, "zero: group " + std::to_string(g) + " out of range");
  if (opt_.stage < 3) return at(params_.get(), offset_[g]);
  if (!live_.count(g)) gather(g);
  Live &l = live_[g];
  wait_live(l);
  // Prefetch the group the pass needs next while this one computes.
  if (opt_.prefetch) {
    int64_t next = backward ? static_cast<int64_t>(g) - 1 : static_cast<int64_t>(g) + 1;
    if (next >= 0 && next < static_cast<int64_t>(size_.size()) &&
        !live_.count(static_cast<uint32_t>(next)))
      gather(static_cast<uint32_t>(next));
  }
  return l.buf.get();
}

void ZeroState::params_done(uint32_t g) {
  if (opt_.stage < 3) return;
  auto it = live_.find(g);
  if (it == live_.end()) return;
  wait_live(it->second);
  spare_.push_back(std::move(it->second.buf));
  live_.erase(it);
}

void ZeroState::end_pass() {
  if (opt_.stage < 3) return;
  for (auto &[g, l] : live_) {
    wait_live(l);
    spare_.push_back(std::move(l.buf));
  }
  live_.clear();
  // Keep at most two spare buffers (the current group and the prefetch),
  // the largest ones, so the next pass allocates nothing.
  std::sort(spare_.begin(), spare_.end(),
            [](const sdk::Buffer &a, const sdk::Buffer &b) { return a.bytes() > b.bytes(); });
  while (spare_.size() > 2) spare_.pop_back();
}

// ---- gradients ------------------------------------------------------------

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
  Pending p;
  for (int64_t g = bucket_lo_; g <= bucket_hi_; ++g)
    if (!frozen_[static_cast<size_t>(g)]) p.groups.push_back(static_cast<uint32_t>(g));
  check(host_->comm->all_reduce(host_->ctx, &t, TSR_REDUCE_AVG, opt_.overlap ? &p.work : nullptr));
  if (p.work)
    pending_.push_back(std::move(p));
  else
    final_.insert(final_.end(), p.groups.begin(), p.groups.end());
  bucket_lo_ = bucket_hi_ = -1;
}

void ZeroState::take_final(uint32_t *groups, size_t cap, size_t *n) {
  if (!n || (cap > 0 && !groups)) throw Error(TSR_ERR_INVALID, "zero: take_final without room");
  // Stages 0-1 only: a stage 2-3 bucket leaves only slices on each rank.
  while (opt_.stage < 2 && pending_.size() > kReducesInFlight) {
    Pending done = std::move(pending_.front());
    pending_.erase(pending_.begin());
    complete(done);
  }
  size_t k = 0;
  while (opt_.stage < 2 && k < cap && final_taken_ < final_.size())
    groups[k++] = final_[final_taken_++];
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
  scatter_bucket_.emplace_back(g, std::move(it->second));
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
  for (auto &[g, buf] : scatter_bucket_) sum_per += per(g);
  // Pack rank-major: rank q's slices of every group in the bucket, in a row,
  // so one reduce-scatter hands each rank exactly its slices.
  p.packed = take(sum_per * world_, TSR_MEM_COMM);
  p.reduced = take(sum_per, TSR_MEM_COMM);
  for (uint32_t q = 0; q < world_; ++q) {
    size_t off = q * sum_per;
    for (auto &[g, buf] : scatter_bucket_) {
      DLTensor src = view(at(buf.get(), q * per(g)), per(g));
      DLTensor dst = view(at(p.packed.get(), off), per(g));
      check(host_->ops->copy(host_->ctx, &src, &dst));
      off += per(g);
    }
  }
  for (auto &[g, buf] : scatter_bucket_) {
    p.groups.push_back(g);
    give(std::move(buf));
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
  if (opt_.stage < 2) final_.insert(final_.end(), p.groups.begin(), p.groups.end());
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

void ZeroState::step(const tsr_zero_step *st) {
  ranges(st->update, st->ctx);
  check(st->flush(st->ctx));
  reshare();
  clear_grads();
}

void ZeroState::clear_grads() {
  if (sunk_) {
    filled_.assign(size_.size(), 0);  // the next puts replace what the sink holds
    return;
  }
  if (!grads_.get()) return;
  size_t grad_elems = opt_.stage < 2 ? grad_total_ : owned_total_;
  DLTensor gv = view(grads_.get(), grad_elems);
  check(host_->ops->fill(host_->ctx, &gv, 0.f));
}

void ZeroState::reshare() {
  // Stages 1-2 hold full parameters but updated only their slices: gather
  // everyone's, a bucket of groups per all-gather (packed like the
  // reduce-scatter: one contiguous run of slices per rank).
  if (!(opt_.stage == 1 || opt_.stage == 2) || world_ == 1) return;
  struct Gather {
    std::vector<uint32_t> groups;
    size_t sum_per = 0;
    sdk::Buffer mine, all;
    tsr_comm_work *work = nullptr;
  };
  std::vector<Gather> gathers;
  const double limit = opt_.bucket_mb * 1048576.0;
  for (uint32_t g = 0; g < size_.size(); ++g) {
    if (frozen_[g]) continue;  // never updated
    if (gathers.empty() ||
        static_cast<double>((gathers.back().sum_per + per(g)) * world_ * esize_) > limit)
      gathers.emplace_back();
    gathers.back().groups.push_back(g);
    gathers.back().sum_per += per(g);
  }
  for (auto &b : gathers) {
    b.mine = take(b.sum_per, TSR_MEM_COMM);
    b.all = take(b.sum_per * world_, TSR_MEM_COMM);
    size_t off = 0;
    for (uint32_t g : b.groups) {
      DLTensor src = view(at(params_.get(), offset_[g] + rank_ * per(g)), per(g));
      DLTensor dst = view(at(b.mine.get(), off), per(g));
      check(host_->ops->copy(host_->ctx, &src, &dst));
      off += per(g);
    }
    DLTensor in = view(b.mine.get(), b.sum_per);
    DLTensor out = view(b.all.get(), b.sum_per * world_);
    check(host_->comm->all_gather(host_->ctx, &in, &out, &b.work));
  }
  for (auto &b : gathers) {
    if (b.work) check(host_->comm->wait(host_->ctx, b.work));
    for (uint32_t q = 0; q < world_; ++q) {
      if (q == rank_) continue;  // ours is already in place
      size_t off = q * b.sum_per;
      for (uint32_t g : b.groups) {
        DLTensor src = view(at(b.all.get(), off), per(g));
        DLTensor dst = view(at(params_.get(), offset_[g] + q * per(g)), per(g));
        check(host_->ops->copy(host_->ctx, &src, &dst));
        off += per(g);
      }
    }
    give(std::move(b.mine));
    give(std::move(b.all));
  }
}

}  // namespace tessera::zero
