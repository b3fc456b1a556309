#include "zero_state.hpp"

#include <algorithm>
#include <string>

namespace tessera::zero {

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
