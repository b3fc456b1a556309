// One optimizer step, top-down (see step.hpp).
#include "train/step.hpp"

#include <cstdint>
#include <iterator>

#include "host/zero_update.hpp"
#include "train/model_pass.hpp"
#include "train/schedule.hpp"
#include "util/error.hpp"

namespace tessera {

namespace {

// What one update hands the offload backend beside each range.
struct UpdateArgs {
  double lr = 0, grad_scale = 1;
  int64_t step = 0;
};

// The squared global gradient norm gives the clipping factor and, in fp16,
// the overflow verdict; both need every rank's slice (the zero plugin sums
// over ranks). Computed on the compute device at the end of backward, so
// the update can start as soon as it is known.
struct Clip {
  double factor = 1;
  bool overflow = false;
  double norm = NAN;  // the global norm, where computed
};

Clip clip_of(StepPlan &p, const TrainState &ts, double loss) {
  Clip c;
  const bool fp16 = p.st.precision == "fp16";
  if (p.st.gradient_clipping <= 0 && !fp16) return c;
  double sq = 0;
  plugin_ok(p.s.host, p.s.zero.vt->grad_norm_sq(p.s.zero.self, &sq), "zero", p.s.zero.name,
            "grad norm");
  c.overflow = !std::isfinite(sq) || !std::isfinite(loss);
  const double norm = std::sqrt(sq) / ts.scaler.scale;
  c.norm = norm;
  if (!c.overflow && p.st.gradient_clipping > 0 && norm > p.st.gradient_clipping)
    c.factor = p.st.gradient_clipping / (norm + 1e-6);
  return c;
}

tsr_status offload_step(StepPlan &p, const UpdateArgs &u, const tsr_owned_range &r) {
  trace::Span span(trace::Stream::offload, "offload step");
  auto it = p.segments.find(r.flat_offset);
  if (it == p.segments.end())
    it = p.segments.emplace(r.flat_offset, p.s.layout.segments(r.flat_offset, r.count)).first;
  tsr_offload_step os{};
  os.struct_size = tsr_offload_step_STRUCT_SIZE;
  os.offset = r.owned_offset;
  os.count = r.count;
  os.grads = r.grads;
  os.params = r.params;
  os.segments = it->second.data();
  os.num_segments = it->second.size();
  os.lr = u.lr;
  os.grad_scale = u.grad_scale;
  os.step = u.step;
  return p.s.offload.vt->step(p.s.offload.self, &os);
}

// Every owned range through the offload backend (those backward handed
// over already excepted), then the re-share where the stage needs it
// (host/zero_update.hpp). The gradients are cleared before the next
// backward, once the backend has read them.
void update_ranges(StepPlan &p, const UpdateArgs &u) {
  Session &s = p.s;
  if (p.started.empty()) {
    p.ranges = s.owned_ranges();
    p.started.assign(p.ranges.size(), 0);
  }
  RangeWalk w;
  w.each = [&](size_t i, const tsr_owned_range &r) {
    return p.started[i] ? TSR_OK : offload_step(p, u, r);
  };
  w.each_what = "[offload] plugin '" + s.offload.name + "' step";
  w.handed_over = [&s] { flight_handed_over(s.flight); };
  w.settle = [&s] { flight_settle(s.flight); };
  w.reshare = s.needs_reshare();
  walk_owned_ranges({s.host, s.zero.vt, s.zero.self, s.zero.name}, p.ranges, w);
  p.started.clear();
}

// Before the first backward after an update: the backend has read the
// gradients (ABI 1.2 says so through wait_grads), so they may be cleared.
void clear_grads(StepPlan &p, TrainState &ts) {
  auto t = p.obs.time(Part::optimizer, "clear gradients");
  flight_wait_grads(p.s.flight);
  plugin_ok(p.s.host, p.s.zero.vt->clear_grads(p.s.zero.self), "zero", p.s.zero.name,
            "clear_grads");
  ts.grads_dirty = false;
}

// Whether the update starts before the step's gradient scale is known,
// speculatively (TSR_EXT_OFFLOAD_SPECULATE): with clipping or fp16 the
// scale needs the global norm, which needs every gradient, so the backend
// steps ranges with the unclipped scale and, once the norm is known, is
// told to keep, redo or undo them (resolve_speculation), bit for bit the
// step it would have made after the norm. Not where the backend holds the
// gradients itself (the gradient sink): its norm is taken over the same
// threads that would be stepping.
bool speculates(const StepPlan &p) {
  const Session &s = p.s;
  return (p.st.gradient_clipping > 0 || p.st.precision == "fp16") &&
         s.offload.caps.offload.speculate && s.offload.caps.offload.wait_params &&
         !s.home.grads_streamed;
}

// Whether a group's owned gradients are final as soon as backward declares
// it done: one rank, not partitioned (no reduction to wait for). Elsewhere
// the zero plugin says which reductions are final (ABI 1.10 final-groups).
bool final_when_declared(const Session &s) {
  return s.host.facts().world_size == 1 && !s.plan.partition_grads;
}

// Whether a step's update may start during its last backward, group by
// group: the owned gradients are final when backward declares them or when
// the zero plugin says so, the backend overlaps (ABI 1.2) and does not
// hold the gradients itself (the gradient sink, whose copies land at
// finish_grads), and the update needs nothing computed over the whole
// gradient first (no clipping norm, no fp16 overflow check) or the backend
// speculates. The ranges then go in the order their gradients became
// final, the same updates as after backward, so the same bits.
bool early_start(const StepPlan &p) {
  const Session &s = p.s;
  const bool needs_norm = p.st.gradient_clipping > 0 || p.st.precision == "fp16";
  return (!needs_norm || speculates(p)) &&
         (final_when_declared(s) || s.zero.caps.zero.final_groups) &&
         s.offload.caps.offload.wait_params && !s.home.grads_streamed;
}

// A speculative round begins: the ranges handed over from now on may be
// redone (fp16: or undone) once the norm is known.
void begin_speculation(StepPlan &p) {
  const auto *sp = p.s.offload.caps.offload.speculate;
  const uint32_t flags = p.st.precision == "fp16" ? TSR_SPECULATE_MAY_SKIP : 0u;
  plugin_ok(p.s.host, sp->begin(p.s.offload.self, flags), "offload", p.s.offload.name,
            "speculate begin");
  p.speculating = true;
}

// The unclipped update of this step (what every range gets before the
// norm is known).
UpdateArgs unclipped(const StepPlan &p, const TrainState &ts) {
  UpdateArgs u;
  u.lr = schedule_lr(p.st.schedule, p.lr0, ts.step, ts.total);
  u.grad_scale = 1.0 / ts.scaler.scale;
  u.step = ts.step + 1 - ts.scaler.skipped;
  return u;
}

// Hands over the owned ranges in flat [lo, hi) not handed over yet;
// returns how many.
size_t start_ranges(StepPlan &p, const UpdateArgs &u, size_t lo, size_t hi) {
  size_t n = 0;
  for (size_t i = 0; i < p.ranges.size(); ++i) {
    const tsr_owned_range &r = p.ranges[i];
    if (p.started[i] || r.flat_offset < lo || r.flat_offset >= hi) continue;
    p.started[i] = 1;
    ++n;
    plugin_ok(p.s.host, offload_step(p, u, r), "offload", p.s.offload.name, "step");
  }
  return n;
}

// Called as backward declares group g's gradients final (PassPhase::grads_final).
// The speculative round begins with the first group, not before the last
// micro-batch: by then its forward has waited for every group of the last
// update, so the backend's begin (which settles that update) costs nothing,
// where before the forward it would end the update's overlap with it.
tsr_status start_group(StepPlan &p, const TrainState &ts, uint32_t g) {
  return guarded(p.s.host.ctx(), [&] {
    if (!p.speculating && speculates(p)) begin_speculation(p);
    const size_t lo = p.s.layout.group_offset[g], hi = lo + p.s.layout.group_size[g];
    p.s.flight.ranges_in_backward += start_ranges(p, unclipped(p, ts), lo, hi);
  });
}

// Called as backward declares a group done where a reduction stands
// between it and its owned gradients (several ranks, or stages 2-3): the groups
// whose reduction the zero plugin has made final since the last call get
// their update started (those left start after finish_grads).
tsr_status start_final_groups(StepPlan &p, const TrainState &ts) {
  const auto *fg = p.s.zero.caps.zero.final_groups;
  uint32_t groups[64];
  size_t n = 0;
  do {
    const tsr_status st = fg->take_final(p.s.zero.self, groups, std::size(groups), &n);
    if (st != TSR_OK) return st;
    for (size_t i = 0; i < n; ++i)
      if (const tsr_status sg = start_group(p, ts, groups[i]); sg != TSR_OK) return sg;
  } while (n == std::size(groups));
  return TSR_OK;
}

// The norm is known: the speculative round's verdict. `apply` false: an
// fp16 overflow, the step is skipped; else the ranges stepped ahead are
// redone when the scale they got (unclipped) is not `u`'s.
void resolve_speculation(StepPlan &p, const TrainState &ts, const UpdateArgs &u, bool apply) {
  const double ahead = 1.0 / ts.scaler.scale;  // before the scaler's update
  const int32_t verdict = !apply                  ? TSR_SPECULATE_SKIP
                          : u.grad_scale != ahead ? TSR_SPECULATE_RESTEP
                                                  : TSR_SPECULATE_KEEP;
  const auto *sp = p.s.offload.caps.offload.speculate;
  plugin_ok(p.s.host, sp->resolve(p.s.offload.self, verdict, u.grad_scale), "offload",
            p.s.offload.name, "speculate resolve");
  p.speculating = false;
}

}  // namespace

double train_step(StepPlan &p, TrainState &ts, Loader &loader) {
  p.obs.begin_step(ts.step + 1);
  p.s.host.set_step(ts.step + 1);
  double loss = 0;
  // The GPU's own time over the step's passes (log.breakdown, CUDA).
  if (p.s.flight.gpu_passes) p.s.flight.gpu_passes->begin();
  for (int64_t m = 0; m < p.st.accumulation; ++m) {
    MicroBatch mb;
    mb.index = static_cast<uint32_t>(m);
    mb.last = m == p.st.accumulation - 1;
    if (mb.last && early_start(p)) {
      p.ranges = p.s.owned_ranges();
      p.started.assign(p.ranges.size(), 0);
      if (final_when_declared(p.s))
        mb.grads_final = [&p, &ts](uint32_t g) { return start_group(p, ts, g); };
      else
        mb.grads_final = [&p, &ts](uint32_t) { return start_final_groups(p, ts); };
    }
    loss += micro_step(p, ts, loader, mb);
  }
  if (p.s.flight.gpu_passes) p.s.flight.gpu_passes->end();
  apply_update(p, ts, loss);
  if (!std::isfinite(loss)) loss = 0;  // fp16: an overflowing step, skipped
  ++ts.step;
  ++ts.in_epoch;
  return loss;
}

double micro_step(StepPlan &p, TrainState &ts, Loader &loader, const MicroBatch &mb) {
  Session &s = p.s;
  auto data_t = p.obs.time(Part::data, "data wait");
  const tsr_batch *batch = loader.next();
  data_t.stop();
  if (!batch) throw Error(TSR_ERR_INTERNAL, "loader ran out of batches mid-epoch");
  tsr_forward_result res{};
  res.struct_size = tsr_forward_result_STRUCT_SIZE;
  auto fwd_t = p.obs.time(Part::forward, "forward");
  PassPhase fwd_phase = forward_phase(mb.last);
  fwd_phase.update = static_cast<uint64_t>(ts.step);
  fwd_phase.micro = mb.index;
  ModelPass fwd(s, fwd_phase);
  plugin_ok(s.host, s.model.vt->forward(s.model.self, fwd.handle(), batch, 1, &res), "model",
            s.model.name, "forward");
  plugin_ok(s.host, s.zero.vt->end_pass(s.zero.self), "zero", s.zero.name, "end_pass");
  fwd_t.stop();
  if (res.count <= 0) throw Error(TSR_ERR_INVALID, "[model] forward counted no targets in a batch");
  // The step's loss is the mean over its samples: each micro-batch's summed
  // loss is scaled by 1 / (its count x accumulation), and the zero plugin
  // averages over ranks.
  const double scale =
      1.0 / (static_cast<double>(res.count) * static_cast<double>(p.st.accumulation));
  // Cleared now, the buffers hold zeros: the model may write its first
  // contribution (ABI 1.5); else it adds into what the last one left.
  const bool cleared = ts.grads_dirty;
  if (cleared) clear_grads(p, ts);
  auto bwd_t = p.obs.time(Part::backward, "backward");
  PassPhase bwd_phase = backward_phase(mb.last, cleared, mb.grads_final);
  bwd_phase.update = fwd_phase.update;
  bwd_phase.micro = mb.index;
  ModelPass bwd(s, bwd_phase);
  plugin_ok(s.host,
            s.model.vt->backward(s.model.self, bwd.handle(), batch,
                                 static_cast<float>(scale * ts.scaler.scale)),
            "model", s.model.name, "backward");
  plugin_ok(s.host, s.zero.vt->end_pass(s.zero.self), "zero", s.zero.name, "end_pass");
  bwd_t.stop();
  const int64_t seen = batch->size * static_cast<int64_t>(s.host.facts().world_size);
  ts.samples += seen;
  ts.interval_samples += seen;
  return res.loss_sum * scale;
}

void apply_update(StepPlan &p, TrainState &ts, double loss) {
  Session &s = p.s;
  auto comm_t = p.obs.time(Part::comm_wait, "finish_grads");
  plugin_ok(s.host, s.zero.vt->finish_grads(s.zero.self), "zero", s.zero.name, "finish_grads");
  comm_t.stop();
  const bool fp16 = p.st.precision == "fp16";
  if (!std::isfinite(loss) && !fp16)
    throw Error(TSR_ERR_INVALID, "loss is " + std::to_string(loss) + " at step " +
                                     std::to_string(ts.step + 1) +
                                     "; lower optimizer.lr or set run.gradient_clipping");
  auto opt_t = p.obs.time(Part::optimizer, "optimizer step");
  // The gradients are final on every rank: where backward could not start
  // the update, a speculating backend starts it now, beside the norm.
  if (speculates(p) && !p.speculating) {
    p.ranges = s.owned_ranges();
    p.started.assign(p.ranges.size(), 0);
    begin_speculation(p);
    start_ranges(p, unclipped(p, ts), 0, SIZE_MAX);
  }
  const Clip clip = clip_of(p, ts, loss);
  ts.grad_norm = clip.norm;
  UpdateArgs u;
  ts.lr = u.lr = schedule_lr(p.st.schedule, p.lr0, ts.step, ts.total);
  u.grad_scale = clip.factor / ts.scaler.scale;  // the scale the gradients carry now
  u.step = ts.step + 1 - ts.scaler.skipped;
  if (p.speculating) resolve_speculation(p, ts, u, !clip.overflow);
  // fp16: a step whose gradients overflowed is skipped (no update; the
  // gradients are still cleared); the optimizer counts applied steps only.
  const bool apply = ts.scaler.update(clip.overflow, ts.step + 1);
  if (apply) {
    update_ranges(p, u);
  } else if (!p.started.empty()) {
    // Skipped after speculation: the backend puts the ranges back; the
    // next forward must see that done.
    flight_handed_over(s.flight);
    flight_settle(s.flight);
    p.started.clear();
  }
  ts.grads_dirty = true;  // the next backward clears them
  opt_t.stop();
}

}  // namespace tessera
