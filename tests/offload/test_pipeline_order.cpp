// The order in which offload cpu's dispatcher updates a step's ranges
// (plugins/offload/cpu/pipeline.hpp): ranges come in backward's order and
// the next forward wants them the other way round, so once a step's ranges
// are all in, the rest run in the order the last step's forward asked for
// them, and a range the host waits for goes next. Checked here: the order
// the optimizer saw after a speculative round's verdict (deterministic: no
// range starts before it), and that any order of waits leaves the bits of
// updates run as they came.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "pipeline.hpp"

namespace {

using namespace tessera::offload;

constexpr size_t kRange = 10000, kCount = 4, kN = kRange * kCount;

// A small SGD with momentum that notes which range each call was in.
struct Recorder {
  std::mutex mu;
  const float *base = nullptr;
  std::vector<size_t> ranges;  // in the order the calls came, repeats folded
};
Recorder *g_rec = nullptr;

tsr_status noting_step(void *, const tsr_optimizer_step_args *a) {
  {
    std::lock_guard<std::mutex> lk(g_rec->mu);
    const size_t r = static_cast<size_t>(a->params - g_rec->base) / kRange;
    if (g_rec->ranges.empty() || g_rec->ranges.back() != r) g_rec->ranges.push_back(r);
  }
  float *m = a->state[0];
  for (size_t i = 0; i < a->n; ++i) {
    m[i] = 0.9f * m[i] + static_cast<float>(a->grads[i] * a->grad_scale);
    a->params[i] -= static_cast<float>(a->lr) * m[i];
  }
  return TSR_OK;
}

struct Rig {
  Recorder rec;
  std::vector<float> master, m, grads;
  tsr_optimizer_vtable vt{};
  ThreadPool pool{2};
  std::unique_ptr<HostPipeline> pipe;
  Rig() : master(kN), m(kN), grads(kN) {
    for (size_t i = 0; i < kN; ++i) {
      master[i] = std::sin(0.001f * i);
      grads[i] = std::cos(0.0007f * i);
    }
    rec.base = master.data();
    g_rec = &rec;
    vt.struct_size = tsr_optimizer_vtable_STRUCT_SIZE;
    vt.step = noting_step;
    PipelineSetup s;
    tsr_host host{};
    s.host = &host;
    s.who = "test pipeline";
    s.opt = &vt;
    s.state_count = 1;
    s.slots[0] = master.data();
    s.slots[1] = m.data();
    s.pool = &pool;
    s.n = kN;
    pipe = std::make_unique<HostPipeline>(s);
  }
  // The ranges as backward hands them over: the last first.
  void submit_backward(double scale, int64_t step) {
    for (size_t r = kCount; r-- > 0;) {
      RangeUpdate u;
      u.offset = r * kRange;
      u.count = kRange;
      u.grads = grads.data() + u.offset;
      u.segments = {tsr_segment{0, kRange, 1}};
      u.lr = 1e-2;
      u.grad_scale = scale;
      u.step = step;
      pipe->submit(u);
    }
  }
  void wait_forward(const std::vector<size_t> &order) {
    for (size_t r : order) pipe->wait_params(r * kRange, kRange);
  }
  std::vector<size_t> take_log() {
    std::lock_guard<std::mutex> lk(rec.mu);
    return std::exchange(rec.ranges, {});
  }
};

}  // namespace

TEST_CASE("offload pipeline: after the verdict, ranges run in the last forward's order",
          "[offload][order]") {
  Rig r;
  r.submit_backward(1.0, 1);
  r.wait_forward({0, 1, 2, 3});  // the forward asks for the first layer first
  // No undo space: every range of the round waits for the verdict, so none
  // has started when it comes and the order is the pipeline's choice alone.
  r.pipe->spec_begin(false);
  r.take_log();
  r.submit_backward(1.0, 2);
  r.pipe->spec_resolve(TSR_SPECULATE_RESTEP, 0.5);
  r.wait_forward({0, 1, 2, 3});
  CHECK(r.take_log() == std::vector<size_t>{0, 1, 2, 3});

  // A forward with another order (a model whose layers are laid out the
  // other way round) is followed the next step.
  r.pipe->spec_begin(false);
  r.submit_backward(1.0, 3);
  r.pipe->spec_resolve(TSR_SPECULATE_KEEP, 1.0);
  r.wait_forward({2, 0, 3, 1});
  r.take_log();
  r.pipe->spec_begin(false);
  r.submit_backward(1.0, 4);
  r.pipe->spec_resolve(TSR_SPECULATE_KEEP, 1.0);
  r.pipe->flush();
  CHECK(r.take_log() == std::vector<size_t>{2, 0, 3, 1});
}

TEST_CASE("offload pipeline: the order of waits changes no bit", "[offload][order]") {
  Rig plain;
  std::vector<float> want;
  {
    for (int64_t step = 1; step <= 6; ++step) plain.submit_backward(1.0, step);
    plain.pipe->flush();
    want = plain.master;
  }
  Rig r;
  std::mt19937 rng(7);
  std::vector<size_t> order{0, 1, 2, 3};
  for (int64_t step = 1; step <= 6; ++step) {
    r.submit_backward(1.0, step);
    std::shuffle(order.begin(), order.end(), rng);
    r.wait_forward(order);  // waits on ranges not yet started move them up
  }
  r.pipe->flush();
  CHECK(std::memcmp(r.master.data(), want.data(), kN * sizeof(float)) == 0);
}
