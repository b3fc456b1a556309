#include "check/gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "util/error.hpp"

namespace tessera {

namespace {

// What the model does through the step handle: which parameters it reads
// (in forward and in backward), which gradients it takes, and how often it
// declares each group's gradients final. Watches the passes of the
// analytic gradient (watch wraps a pass's hooks).
struct Probe {
  const Layout &layout;
  std::vector<int> read_fwd, read_bwd, grad_taken;  // per parameter
  std::vector<int> done;                            // per layout group
  std::vector<std::string> late;                    // gradients taken after grads_done
  std::vector<size_t> grad_order;                   // parameters by first gradient taken

  explicit Probe(const Layout &l)
      : layout(l),
        read_fwd(l.params.size(), 0),
        read_bwd(l.params.size(), 0),
        grad_taken(l.params.size(), 0),
        done(l.group_offset.size(), 0) {}
  Probe(const Probe &) = delete;
  Probe &operator=(const Probe &) = delete;

  void watch(StepHooks &h, bool backward) {
    h.param = [this, backward, base = h.param](uint32_t i, DLTensor *out) {
      if (i < read_fwd.size()) ++(backward ? read_bwd : read_fwd)[i];
      return base(i, out);
    };
    h.grad = [this, base = h.grad](uint32_t i, DLTensor *out) {
      if (i < grad_taken.size()) {
        if (grad_taken[i]++ == 0) grad_order.push_back(i);
        const ParamSlot &p = layout.params[i];
        if (done[p.group] > 0) late.push_back(p.name);
      }
      return base(i, out);
    };
    h.grads_done = [this, base = h.grads_done](uint32_t model_group) {
      uint32_t first = 0, last = 0;
      if (layout.group_index(model_group, &first, &last))
        for (uint32_t g = first; g <= last; ++g) ++done[g];
      return base(model_group);
    };
  }
};

float *group_base(Session &s, uint32_t g, bool grad) {
  void *base = nullptr;
  plugin_ok(
      s.host,
      grad ? s.zero.vt->grads(s.zero.self, g, &base) : s.zero.vt->params(s.zero.self, g, 0, &base),
      grad ? "[zero] grads" : "[zero] params");
  return static_cast<float *>(base);
}

float *param_data(Session &s, const ParamSlot &p) {
  return group_base(s, p.group, false) + (p.offset - s.layout.group_offset[p.group]);
}

tsr_forward_result forward(Session &s, const tsr_batch &batch, Probe *probe = nullptr) {
  tsr_forward_result r{};
  r.struct_size = tsr_forward_result_STRUCT_SIZE;
  r.correct = -2;
  ModelPass pass(s, forward_phase());
  if (probe) probe->watch(pass.hooks, false);
  plugin_ok(s.host, s.model.vt->forward(s.model.self, pass.handle(), &batch, 1, &r),
            "[model] forward");
  plugin_ok(s.host, s.zero.vt->end_pass(s.zero.self), "[zero] end_pass");
  if (r.count <= 0)
    throw Error(TSR_ERR_INVALID, "[model] forward counted " + std::to_string(r.count) +
                                     " targets in a batch of " + std::to_string(batch.size) +
                                     "; it must set tsr_forward_result.count to the targets its "
                                     "loss_sum adds up");
  return r;
}

double mean_loss(Session &s, const tsr_batch &batch) {
  const tsr_forward_result r = forward(s, batch);
  return r.loss_sum / static_cast<double>(r.count);
}

// d(mean loss)/d(parameters), flat: gradients zeroed, one forward and one
// backward with loss_scale 1/count, the zero plugin's reduction finished.
std::vector<float> analytic_gradients(Session &s, const tsr_batch &batch, tsr_forward_result *fwd,
                                      Probe &probe) {
  // Frozen groups have no gradient (their part of the result stays 0).
  for (uint32_t g = 0; g < s.layout.group_offset.size(); ++g)
    if (!s.layout.group_frozen[g])
      std::memset(group_base(s, g, true), 0, s.layout.group_size[g] * sizeof(float));
  *fwd = forward(s, batch, &probe);
  ModelPass pass(s, backward_phase(true));
  probe.watch(pass.hooks, true);
  const float scale = static_cast<float>(1.0 / static_cast<double>(fwd->count));
  plugin_ok(s.host, s.model.vt->backward(s.model.self, pass.handle(), &batch, scale),
            "[model] backward");
  plugin_ok(s.host, s.zero.vt->end_pass(s.zero.self), "[zero] end_pass");
  plugin_ok(s.host, s.zero.vt->finish_grads(s.zero.self), "[zero] finish_grads");
  std::vector<float> flat(s.layout.total, 0.f);
  for (uint32_t g = 0; g < s.layout.group_offset.size(); ++g)
    if (!s.layout.group_frozen[g])
      std::memcpy(flat.data() + s.layout.group_offset[g], group_base(s, g, true),
                  s.layout.group_size[g] * sizeof(float));
  return flat;
}

std::string names_of_group(const Layout &L, uint32_t g) {
  std::string out;
  for (const auto &p : L.params)
    if (p.group == g) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

// param_info keeps the host's struct_size and writes nothing past it;
// forward leaves its result's struct_size alone and fills count/correct.
ConventionCheck check_struct_sizes(Session &s, const tsr_forward_result &fwd) {
  ConventionCheck c{"struct sizes", true, ""};
  std::vector<std::string> bad;
  for (size_t i = 0; i < s.layout.params.size(); ++i) {
    struct {
      tsr_param_info info;
      unsigned char guard[64];
    } probe;
    std::memset(&probe, 0xA5, sizeof probe);
    std::memset(&probe.info, 0, sizeof probe.info);
    probe.info.struct_size = tsr_param_info_STRUCT_SIZE;
    plugin_ok(s.host, s.model.vt->param_info(s.model.self, i, &probe.info), "[model] param_info");
    const std::string who = "param_info(" + std::to_string(i) + ")";
    if (probe.info.struct_size != sizeof probe.info)
      bad.push_back(who + " changed struct_size from " + std::to_string(sizeof probe.info) +
                    " to " + std::to_string(probe.info.struct_size) +
                    " (keep the host's size: save it, copy, restore it)");
    for (unsigned char b : probe.guard)
      if (b != 0xA5) {
        bad.push_back(who + " wrote past the host's struct_size of " +
                      std::to_string(sizeof probe.info) + " bytes (copy at most struct_size)");
        break;
      }
  }
  if (fwd.struct_size != sizeof fwd)
    bad.push_back("forward changed tsr_forward_result.struct_size to " +
                  std::to_string(fwd.struct_size));
  if (fwd.correct < -1 || fwd.correct > fwd.count)
    bad.push_back("forward set correct = " + std::to_string(fwd.correct) +
                  " (targets predicted right, 0.." + std::to_string(fwd.count) + ", or -1)");
  c.ok = bad.empty();
  c.detail = "model vtable " + std::to_string(s.model.vt->struct_size) + " bytes (this host's " +
             std::to_string(sizeof(tsr_model_vtable)) + ")";
  for (const auto &b : bad) c.detail += "; " + b;
  if (c.ok) c.detail += "; param_info and forward keep the host's struct_size";
  return c;
}

ConventionCheck check_groups(const Session &s, const Probe &p) {
  ConventionCheck c{"groups", true, ""};
  const Layout &L = s.layout;
  std::vector<int> used(L.group_offset.size(), 0);
  std::string never;
  for (size_t i = 0; i < L.params.size(); ++i) {
    used[L.params[i].group] += p.read_fwd[i];
    if (p.read_fwd[i] + p.read_bwd[i] == 0) never += (never.empty() ? "" : ", ") + L.params[i].name;
  }
  size_t n_used = 0;
  for (size_t g = 0; g < used.size(); ++g) {
    if (used[g] > 0) {
      ++n_used;
      continue;
    }
    c.ok = false;
    c.detail += "; group " + std::to_string(L.model_group[g]) + " (" +
                names_of_group(L, static_cast<uint32_t>(g)) +
                ") is declared but forward reads none of its parameters";
  }
  if (!never.empty()) {
    c.ok = false;
    c.detail += "; declared but never read: " + never + " (drop them, or read them in forward)";
  }
  c.detail = std::to_string(L.group_offset.size()) + " declared, " + std::to_string(n_used) +
             " read by forward" + c.detail;
  return c;
}

ConventionCheck check_grads_done(const Session &s, const Probe &p) {
  ConventionCheck c{"grads_done", true, ""};
  const Layout &L = s.layout;
  size_t trainable_groups = 0;
  for (uint32_t g = 0; g < L.group_offset.size(); ++g) {
    bool trainable = false;
    for (const auto &q : L.params) trainable |= q.group == g && q.trainable;
    if (!trainable) continue;
    ++trainable_groups;
    const std::string which =
        "group " + std::to_string(L.model_group[g]) + " (" + names_of_group(L, g) + ")";
    if (p.done[g] == 0)
      c.detail += "; backward never calls grads_done for " + which +
                  ": call host->grads_done(step, " + std::to_string(L.model_group[g]) +
                  ") once its gradients are final (ZeRO stages 2-3 reduce it then)";
    else if (p.done[g] > 1)
      c.detail += "; grads_done for " + which + " is called " + std::to_string(p.done[g]) +
                  " times in one backward (once, when its gradients are final)";
    c.ok = c.ok && p.done[g] == 1;
  }
  for (const auto &name : p.late) {
    c.ok = false;
    c.detail += "; backward takes the gradient of " + name +
                " after grads_done for its group (the host may have reduced and freed it)";
  }
  c.detail = "once for each of " + std::to_string(trainable_groups) + " trainable groups" +
             (c.ok ? "" : ": no") + c.detail;
  return c;
}

ConventionCheck check_determinism(Session &s, const tsr_batch &batch) {
  const tsr_forward_result a = forward(s, batch), b = forward(s, batch);
  ConventionCheck c{"forward", true, ""};
  const double scale = std::max(std::fabs(a.loss_sum), 1e-30);
  c.ok = std::fabs(a.loss_sum - b.loss_sum) <= 1e-9 * scale && a.count == b.count;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s for the same batch and parameters (loss_sum %.9g%s%.9g)",
                c.ok ? "deterministic" : "NOT deterministic", a.loss_sum,
                c.ok ? ", again " : " then ", b.loss_sum);
  c.detail = buf;
  if (!c.ok)
    c.detail +=
        "; finite differences need the same loss for the same parameters: draw dropout and "
        "other noise from host->rng seeded by the step, or turn it off for the check (--set)";
  return c;
}

// The elements of a tensor to check: all of them when few, else half the
// largest analytic gradients (where a wrong backward shows most) and half
// drawn at random.
std::vector<size_t> pick_elements(const float *grad, size_t n, const GradCheckOptions &o,
                                  std::mt19937_64 &rng) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  if (o.max_elements <= 0 || n <= static_cast<size_t>(o.max_elements)) return idx;
  const size_t k = static_cast<size_t>(o.max_elements), top = k / 2;
  std::partial_sort(idx.begin(), idx.begin() + static_cast<ptrdiff_t>(top), idx.end(),
                    [&](size_t a, size_t b) { return std::fabs(grad[a]) > std::fabs(grad[b]); });
  std::shuffle(idx.begin() + static_cast<ptrdiff_t>(top), idx.end(), rng);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// (L(x + h) - L(x - h)) / (2h) for element `x`, with the steps actually
// representable in fp32 around it.
double central_difference(Session &s, const tsr_batch &batch, float *x, double h) {
  const float x0 = *x;
  const float up = static_cast<float>(x0 + h), down = static_cast<float>(x0 - h);
  *x = up;
  const double lp = mean_loss(s, batch);
  *x = down;
  const double lm = mean_loss(s, batch);
  *x = x0;
  return (lp - lm) / (static_cast<double>(up) - static_cast<double>(down));
}

// (L(x + h) - L(x)) / h, or backward with h < 0: at a kink (ReLU, max)
// closer than the step on one side, the difference on the other side does
// not cross it.
double one_sided_difference(Session &s, const tsr_batch &batch, float *x, double h, double l0) {
  const float x0 = *x;
  const float moved = static_cast<float>(x0 + h);
  *x = moved;
  const double l = mean_loss(s, batch);
  *x = x0;
  return (l - l0) / (static_cast<double>(moved) - static_cast<double>(x0));
}

// The numeric derivative at element `x`: the central difference, unless it
// disagrees with the analytic `a` by more than the tolerance and fp32's
// `floor`; then the closest of a tenth of the step, centred and one-sided,
// which a kink near x spoils at most one side of. A wrong backward
// disagrees with all of them.
double numeric_derivative(Session &s, const tsr_batch &batch, float *x, double h, double a,
                          double tolerance, double floor) {
  double best = central_difference(s, batch, x, h);
  auto off = [&](double n) { return std::fabs(n - a); };
  if (off(best) <= tolerance * std::max(std::fabs(a), std::fabs(best)) + floor) return best;
  const double l0 = mean_loss(s, batch);
  for (double n :
       {central_difference(s, batch, x, h / 10), one_sided_difference(s, batch, x, h / 10, l0),
        one_sided_difference(s, batch, x, -h / 10, l0)})
    if (off(n) < off(best)) best = n;
  return best;
}

// How much rounding moves the mean loss: a central difference divides this
// by its step, so it sets the smallest error the check can see. A loss
// summed in fp32 (its sum is an fp32 number) is off by up to half an ulp of
// the sum. Beyond that, each sample moves one element by 2^-20 of itself (a
// few ulps, so that the loss's true change, a * dx, is far below the noise
// and is subtracted anyway) and takes what is left of the change; the
// largest of up to 16 samples spread over the tensors.
double measure_loss_noise(Session &s, const tsr_batch &batch, const std::vector<float> &grads,
                          double loss) {
  const tsr_forward_result r = forward(s, batch);
  const bool fp32_sum =
      static_cast<double>(static_cast<float>(r.loss_sum)) == r.loss_sum && r.loss_sum != 0;
  double noise = fp32_sum ? std::ldexp(std::fabs(r.loss_sum), -24) / static_cast<double>(r.count)
                          : std::ldexp(std::fabs(loss), -52);
  std::vector<const ParamSlot *> trainable;
  for (const ParamSlot &p : s.layout.params)
    if (p.trainable && p.numel > 0) trainable.push_back(&p);
  for (size_t k = 0; k < 16 && !trainable.empty(); ++k) {
    const ParamSlot &p = *trainable[k % trainable.size()];
    float *x = param_data(s, p);
    const size_t i = (k / trainable.size() * 7919 + k) % p.numel;  // spread over the tensor
    const float x0 = x[i];
    if (x0 == 0.f) continue;
    const float moved = x0 + std::ldexp(x0, -20);
    x[i] = moved;
    const double l = mean_loss(s, batch);
    x[i] = x0;
    const double dx = static_cast<double>(moved) - static_cast<double>(x0);
    noise = std::max(noise, std::fabs(l - loss - grads[p.offset + i] * dx));
  }
  return noise;
}

std::vector<int64_t> unravel(size_t flat, const std::vector<int64_t> &shape) {
  std::vector<int64_t> idx(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = static_cast<int64_t>(flat % static_cast<size_t>(shape[d]));
    flat /= static_cast<size_t>(shape[d]);
  }
  return idx;
}

TensorCheck check_tensor(Session &s, const tsr_batch &batch, const ParamSlot &p, const float *grad,
                         const GradCheckOptions &o, double loss_noise, std::mt19937_64 &rng) {
  TensorCheck t;
  t.name = p.name;
  t.shape = p.shape;
  t.numel = p.numel;
  t.trainable = p.trainable;
  if (!p.trainable) return t;
  float *x = param_data(s, p);
  double sq = 0;
  for (size_t i = 0; i < p.numel; ++i) sq += static_cast<double>(x[i]) * x[i];
  // A step of 1e-2 relative to the tensor's scale (at least 1e-2): large
  // enough that fp32 rounding of the loss stays small against it.
  t.step = 1e-2 * std::max(1.0, std::sqrt(sq / static_cast<double>(p.numel)));
  // Both losses of the central difference carry up to loss_noise of
  // rounding: their difference over 2h errs by up to loss_noise / h. Twice
  // that, as the measure is a sample.
  t.floor = 2 * loss_noise / t.step;
  double err_sq = 0, num_sq = 0, ana_sq = 0, worst = -1;
  for (size_t i : pick_elements(grad, p.numel, o, rng)) {
    const double a = grad[i];
    const double n = numeric_derivative(s, batch, x + i, t.step, a, o.tolerance, t.floor);
    err_sq += (n - a) * (n - a);
    num_sq += n * n;
    ana_sq += a * a;
    if (std::fabs(n - a) > worst) {
      worst = std::fabs(n - a);
      t.worst_index = unravel(i, p.shape);
      t.worst_analytic = a;
      t.worst_numeric = n;
    }
    ++t.checked;
  }
  const double denom = std::sqrt(std::max(num_sq, ana_sq));
  // Both gradients zero (to rounding): nothing to compare, and nothing wrong.
  t.rel_error = denom > 1e-12 ? std::sqrt(err_sq) / denom : 0;
  const double allowed = o.tolerance * denom + t.floor * std::sqrt(static_cast<double>(t.checked));
  t.excess = allowed > 0 ? std::sqrt(err_sq) / allowed : 0;
  t.ok = t.excess <= 1;
  t.near_noise = t.checked > 0 && denom / std::sqrt(static_cast<double>(t.checked)) < 10 * t.floor;
  return t;
}

}  // namespace

bool GradCheckReport::ok() const {
  for (const auto &c : conventions)
    if (!c.ok) return false;
  for (const auto &t : tensors)
    if (!t.ok) return false;
  return true;
}

int GradCheckReport::blamed() const {
  std::vector<size_t> order = backward_order;
  if (order.empty())  // no gradient taken at all: declared order, last first
    for (size_t i = tensors.size(); i-- > 0;) order.push_back(i);
  // Each failing tensor's jump: its excess over that of the tensor backward
  // computed just before it (at least 1, a pass).
  std::vector<std::pair<size_t, double>> jumps;
  double before = 0, most = 0;
  for (size_t i : order) {
    if (i >= tensors.size() || !tensors[i].trainable) continue;
    const double e = tensors[i].excess;
    if (!tensors[i].ok) {
      jumps.emplace_back(i, e / std::max(1.0, before));
      most = std::max(most, jumps.back().second);
    }
    before = e;
  }
  // The first in backward order whose jump is near the largest: a barely
  // failing tensor before it is noise, and a later jump as large is the
  // same fault met again (the op used in an earlier layer).
  for (const auto &[i, jump] : jumps)
    if (jump >= 0.5 * most) return static_cast<int>(i);
  // A failing tensor backward never took a gradient of (so not in order).
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!tensors[i].ok) return static_cast<int>(i);
  return -1;
}

std::string GradCheckReport::first_failure(double tolerance) const {
  if (const int b = blamed(); b >= 0) {
    const TensorCheck &t = tensors[static_cast<size_t>(b)];
    size_t others = 0;
    for (const auto &u : tensors) others += u.ok ? 0 : 1;
    char buf[200];
    std::snprintf(buf, sizeof buf, "relative error %.3g, tolerance %.3g + fp32 noise %.2g",
                  t.rel_error, tolerance, t.floor);
    std::string out = t.name +
                      ": the analytic gradient (backward) does not match the numeric one (" + buf +
                      "); check the backward of " + t.name;
    if (others > 1)
      out += ", where the error starts: " + std::to_string(others - 1) +
             " other tensors fail, those whose gradients backward computes after it (a wrong "
             "gradient flows on to them)";
    return out;
  }
  for (const auto &c : conventions)
    if (!c.ok) return c.what + ": " + c.detail;
  return "";
}

GradCheckReport check_model(Session &s, const tsr_batch &batch, const GradCheckOptions &o,
                            const std::function<void(const TensorCheck &)> &on_tensor) {
  TSR_CHECK(s.training && s.host.facts().world_size == 1 &&
                s.host.facts().device.device_type == kDLCPU && s.compute_bytes() == 4,
            TSR_ERR_INTERNAL, "the gradient check needs a one-rank fp32 CPU training session");
  GradCheckReport rep;
  Probe probe(s.layout);
  tsr_forward_result fwd{};
  const std::vector<float> grads = analytic_gradients(s, batch, &fwd, probe);
  rep.loss = fwd.loss_sum / static_cast<double>(fwd.count);
  rep.conventions.push_back(check_struct_sizes(s, fwd));
  rep.conventions.push_back(check_groups(s, probe));
  rep.conventions.push_back(check_grads_done(s, probe));
  rep.conventions.push_back(check_determinism(s, batch));
  rep.loss_noise = measure_loss_noise(s, batch, grads, rep.loss);
  rep.backward_order = probe.grad_order;
  std::mt19937_64 rng(o.seed);
  for (const ParamSlot &p : s.layout.params) {
    rep.tensors.push_back(
        check_tensor(s, batch, p, grads.data() + p.offset, o, rep.loss_noise, rng));
    if (on_tensor) on_tensor(rep.tensors.back());
  }
  return rep;
}

}  // namespace tessera
