#include "train/breakdown.hpp"

namespace tessera {

namespace {

double to_s(int64_t ns) {
  return static_cast<double>(ns) * 1e-9;
}

}  // namespace

const char *part_key(Part p) {
  static const char *keys[kParts] = {"data",      "forward",    "backward", "comm_wait",
                                     "optimizer", "checkpoint", "eval"};
  return keys[static_cast<int>(p)];
}

Breakdown::Breakdown()
    : start_ns_(trace::now_ns()),
      interval_start_ns_(start_ns_),
      settled_waits_ns_(trace::waited_ns()) {
  trace::set_counting_waits(true);
}

void Breakdown::settle() {
  const int64_t now = trace::waited_ns();
  const int64_t unscoped = now - settled_waits_ns_ - scoped_waits_ns_;
  if (unscoped > 0) add(Part::comm_wait, to_s(unscoped));
  settled_waits_ns_ = now;
  scoped_waits_ns_ = 0;
}

Breakdown::~Breakdown() {
  trace::set_counting_waits(false);
}

double Breakdown::wall() const {
  return to_s(trace::now_ns() - start_ns_);
}

Breakdown::Scope::Scope(Breakdown *b, Part p, const char *span_name)
    : b_(b),
      part_(p),
      span_(trace::recording() ? span_name : nullptr),
      step_(span_ ? trace::current_step() : -1),
      t0_(trace::now_ns()),
      waited0_(trace::waited_ns()) {}

void Breakdown::Scope::stop() {
  if (!b_) return;
  const int64_t t1 = trace::now_ns();
  const double dt = to_s(t1 - t0_);
  const int64_t waited_ns = trace::waited_ns() - waited0_;
  const double waited = to_s(waited_ns);
  b_->scoped_waits_ns_ += waited_ns;
  switch (part_) {
    case Part::comm_wait:
    case Part::eval:
    case Part::checkpoint:
      b_->add(part_, dt);
      break;
    default:
      b_->add(part_, dt - waited);
      b_->add(Part::comm_wait, waited);
      break;
  }
  if (span_) trace::record(trace::Event{span_, trace::Stream::compute, 0, t0_, t1, step_, -1});
  b_ = nullptr;
}

nlohmann::json Breakdown::take_interval(int64_t steps) {
  settle();
  const double wall = to_s(trace::now_ns() - interval_start_ns_);
  nlohmann::json j = {{"steps", steps}, {"total", wall}};
  double sum = 0;
  for (int p = 0; p < kParts; ++p) {
    j[part_key(static_cast<Part>(p))] = interval_[static_cast<size_t>(p)];
    sum += interval_[static_cast<size_t>(p)];
  }
  j["other"] = wall - sum;
  interval_.fill(0);
  return j;
}

void Breakdown::restart_interval() {
  settle();
  interval_.fill(0);  // waits while the line printed: none expected, counted in no interval
  interval_start_ns_ = trace::now_ns();
}

}  // namespace tessera
