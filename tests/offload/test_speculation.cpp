// offload cpu's speculative update (plugins/offload/cpu/pipeline.hpp,
// undo.hpp) driven directly, on the CPU: ranges stepped ahead of the
// verdict with scale 1 and then kept, redone with another scale, or undone
// (the fp16 skip, which the engine only takes on the GPU) leave master,
// state and compute parameters bit for bit what a plain step with the
// verdict's scale leaves (or untouched, for a skip). Also with an undo
// space too small for every range (the rest are held until the verdict),
// with the verdict arriving before the dispatcher reaches a range, and the
// misuses the pipeline refuses.
//
// The optimizer is a small AdamW of this file's own: the pipeline only
// needs a CPU step whose result depends on the scale non-linearly.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "pipeline.hpp"

namespace {

using namespace tessera::offload;

tsr_status adamw_step(void *, const tsr_optimizer_step_args *a) {
  float *m = a->state[0], *v = a->state[1];
  for (size_t i = 0; i < a->n; ++i) {
    const float g = static_cast<float>(a->grads[i] * a->grad_scale);
    m[i] = 0.9f * m[i] + 0.1f * g;
    v[i] = 0.999f * v[i] + 0.001f * g * g;
    const float mh = m[i] / static_cast<float>(1 - std::pow(0.9, double(a->step)));
    const float vh = v[i] / static_cast<float>(1 - std::pow(0.999, double(a->step)));
    a->params[i] -=
        static_cast<float>(a->lr) * (mh / (std::sqrt(vh) + 1e-8f) + 0.01f * a->params[i]);
    if (a->compute_params) static_cast<float *>(a->compute_params)[i] = a->params[i];
  }
  return TSR_OK;
}

tsr_optimizer_vtable adamw_table() {
  tsr_optimizer_vtable vt{};
  vt.struct_size = tsr_optimizer_vtable_STRUCT_SIZE;
  vt.step = adamw_step;
  return vt;
}

constexpr size_t kN = 70000;  // two ranges: 50000 and 20000 elements
const size_t kRanges[2][2] = {{0, 50000}, {50000, 20000}};

// Master, two state arrays, gradients and compute parameters of kN
// elements, after a few plain steps so the state is not zero.
struct World {
  std::vector<float> master, m, v, grads, params;
  World() : master(kN), m(kN), v(kN), grads(kN), params(kN) {
    for (size_t i = 0; i < kN; ++i) {
      master[i] = params[i] = std::sin(0.001f * i);
      m[i] = 0.01f * std::cos(0.003f * i);
      v[i] = 1e-4f * (1 + std::sin(0.007f * i));
      grads[i] = std::cos(0.0005f * i) * 3.0f;
    }
  }
  bool operator==(const World &o) const {
    auto same = [](const std::vector<float> &a, const std::vector<float> &b) {
      return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    return same(master, o.master) && same(m, o.m) && same(v, o.v) && same(params, o.params);
  }
};

struct Rig {
  World w;
  tsr_optimizer_vtable vt = adamw_table();
  ThreadPool pool{2};
  std::vector<char> undo;
  std::unique_ptr<HostPipeline> pipe;
  explicit Rig(size_t undo_bytes, bool worst_case, bool adaptive = true) : undo(undo_bytes) {
    PipelineSetup s;
    tsr_host host{};
    s.host = &host;  // a CPU run without the gradient sink never calls it
    s.who = "test pipeline";
    s.opt = &vt;
    s.state_count = 2;
    s.slots[0] = w.master.data();
    s.slots[1] = w.m.data();
    s.slots[2] = w.v.data();
    s.pool = &pool;
    s.n = kN;
    s.undo = undo.empty() ? nullptr : undo.data();
    s.undo_bytes = undo.size();
    s.worst_case = worst_case;
    s.adaptive = adaptive;
    pipe = std::make_unique<HostPipeline>(s);
  }
  void submit_all(double scale, int64_t step) {
    for (const auto &r : kRanges) {
      RangeUpdate u;
      u.offset = r[0];
      u.count = r[1];
      u.grads = w.grads.data() + r[0];
      u.params = w.params.data() + r[0];
      u.segments = {tsr_segment{0, r[1], 1}};
      u.lr = 1e-3;
      u.grad_scale = scale;
      u.step = step;
      pipe->submit(u);
    }
  }
};

constexpr size_t kWhole = kN * 16 + 4096;  // every range, compute parameters too

// One speculative step resolved `verdict` against the plain step it stands for.
void check_verdict(int32_t verdict, size_t undo_bytes, bool worst_case) {
  const double scale = 0.25;
  Rig plain(0, false), spec(undo_bytes, worst_case);
  plain.submit_all(1.0, 1);  // a first step, the same for both
  spec.submit_all(1.0, 1);
  if (verdict != TSR_SPECULATE_SKIP)
    plain.submit_all(verdict == TSR_SPECULATE_KEEP ? 1.0 : scale, 2);
  plain.pipe->flush();
  spec.pipe->spec_begin(true);
  spec.submit_all(1.0, 2);
  spec.pipe->spec_resolve(verdict, scale);
  spec.pipe->flush();
  CHECK(spec.w == plain.w);
  const tsr_speculate_stats st = spec.pipe->spec_stats();
  CHECK(st.steps == 1);
  if (worst_case && undo_bytes > 0 && verdict != TSR_SPECULATE_KEEP) {
    // At least the first range was stepped ahead and then redone or undone.
    CHECK(st.elements_redone >= kRanges[0][1]);
    CHECK((verdict == TSR_SPECULATE_SKIP ? st.restored : st.redone) == 1);
  }
  if (verdict == TSR_SPECULATE_KEEP) CHECK(st.elements_redone == 0);
}

}  // namespace

TEST_CASE("speculative offload steps: keep or restep or skip gives the plain step's bits",
          "[offload][speculate]") {
  for (int32_t v : {TSR_SPECULATE_KEEP, TSR_SPECULATE_RESTEP, TSR_SPECULATE_SKIP}) {
    INFO("verdict " << v);
    check_verdict(v, kWhole, true);   // every range stepped ahead
    check_verdict(v, kWhole, false);  // a race with the dispatcher: any mix
    // Room for the first range only: the second is held for the verdict.
    check_verdict(v, 50000 * 16 + 256, true);
    check_verdict(v, 0, true);  // no undo space: every range waits
  }
}

TEST_CASE("speculative offload steps: the stats count what was redone", "[offload][speculate]") {
  Rig r(kWhole, true);
  r.pipe->spec_begin(false);
  r.submit_all(1.0, 1);
  r.pipe->spec_resolve(TSR_SPECULATE_RESTEP, 0.5);
  r.pipe->flush();
  tsr_speculate_stats st = r.pipe->spec_stats();
  CHECK(st.steps == 1);
  CHECK(st.redone == 1);
  CHECK(st.restored == 0);
  CHECK(st.elements_redone == kN);
  CHECK(st.redo_s > 0);
  CHECK(st.held_s == 0);
}

// speculation = "adaptive": a round after one whose verdict changed the
// update steps nothing ahead (its ranges wait for the verdict), so where
// the norm clips step after step nothing is kept and redone; after a kept
// round it speculates again. "always" redoes every clipped round. Both
// give the plain steps' bits.
TEST_CASE("speculative offload steps: adaptive holds the round after a changed one",
          "[offload][speculate]") {
  // The verdicts of four steps: clipped, clipped, kept, clipped.
  const int32_t verdicts[] = {TSR_SPECULATE_RESTEP, TSR_SPECULATE_RESTEP, TSR_SPECULATE_KEEP,
                              TSR_SPECULATE_RESTEP};
  for (bool adaptive : {true, false}) {
    INFO((adaptive ? "adaptive" : "always"));
    Rig plain(0, false), spec(kWhole, true, adaptive);
    int64_t step = 0;
    for (int32_t v : verdicts) {
      ++step;
      const double scale = v == TSR_SPECULATE_KEEP ? 1.0 : 0.5;
      plain.submit_all(scale, step);
      spec.pipe->spec_begin(false);
      spec.submit_all(1.0, step);
      spec.pipe->spec_resolve(v, scale);
    }
    plain.pipe->flush();
    spec.pipe->flush();
    CHECK(spec.w == plain.w);
    const tsr_speculate_stats st = spec.pipe->spec_stats();
    CHECK(st.steps == 4);
    // Adaptive: the first and the last clipped rounds were stepped ahead
    // (each followed nothing, or a kept round); the second and the kept
    // one waited for their verdicts.
    CHECK(st.redone == (adaptive ? 2u : 3u));
    CHECK(st.elements_redone == (adaptive ? 2u : 3u) * kN);
    if (adaptive) CHECK(st.held_s > 0);
  }
}

TEST_CASE("speculative offload steps: misuse is refused by name", "[offload][speculate]") {
  Rig r(kWhole, true);
  CHECK_THROWS_WITH(r.pipe->spec_resolve(TSR_SPECULATE_KEEP, 1.0),
                    Catch::Contains("resolved without begin"));
  r.pipe->spec_begin(false);
  r.submit_all(1.0, 1);
  CHECK_THROWS_WITH(r.pipe->spec_resolve(TSR_SPECULATE_SKIP, 1.0),
                    Catch::Contains("TSR_SPECULATE_MAY_SKIP"));
  CHECK_THROWS_WITH(r.pipe->spec_resolve(7, 1.0), Catch::Contains("verdict 7"));
  r.pipe->spec_resolve(TSR_SPECULATE_KEEP, 1.0);
  r.pipe->flush();
}
