// The step handle of one model pass (see model_pass.hpp).
#include "train/model_pass.hpp"

#include <cstring>
#include <string>

#include "train/session.hpp"

namespace tessera {

namespace {

// Parameter or gradient i as a tensor on the run's device, inside its
// group's buffer. Parameters wait for an update in flight first.
tsr_status view(Session &s, uint32_t i, bool grad, bool backward, DLTensor *out) {
  const Layout &L = s.layout;
  if (i >= L.params.size())
    return s.host.table()->error(
        s.host.ctx(), TSR_ERR_INVALID,
        ("parameter index " + std::to_string(i) + " out of range").c_str());
  ParamSlot &p = s.layout.params[i];
  if (grad && !p.trainable)
    return s.host.table()->error(s.host.ctx(), TSR_ERR_INVALID,
                                 ("model '" + s.model.name + "' asked for the gradient of '" +
                                  p.name + "', which is frozen (trainable = 0): it has none")
                                     .c_str());
  void *base = nullptr;
  tsr_status st = grad ? TSR_OK : flight_wait_near(s.flight, p.group, backward);
  if (st != TSR_OK) return st;
  st = grad ? s.zero.vt->grads(s.zero.self, p.group, &base)
            : s.zero.vt->params(s.zero.self, p.group, backward ? 1 : 0, &base);
  if (st != TSR_OK) return st;
  std::memset(out, 0, sizeof *out);
  out->data = static_cast<char *>(base) + (p.offset - L.group_offset[p.group]) * s.compute_bytes();
  out->device = s.host.facts().device;
  out->ndim = static_cast<int32_t>(p.shape.size());
  out->dtype = s.compute_dtype();
  out->shape = p.shape.data();
  return TSR_OK;
}

// Models name groups by their own numbers; the zero plugin by position. A
// model group whose parameters are partly frozen is two layout groups
// (plugin/layout.hpp): [*first, *last].
tsr_status groups_of(Session &s, uint32_t model_group, uint32_t *first, uint32_t *last) {
  if (s.layout.group_index(model_group, first, last)) return TSR_OK;
  return s.host.table()->error(
      s.host.ctx(), TSR_ERR_INVALID,
      ("model '" + s.model.name + "' named group " + std::to_string(model_group) +
       ", which none of its parameters declares")
          .c_str());
}

}  // namespace

ModelPass::ModelPass(Session &s, PassPhase phase) : host_(s.host) {
  const bool backward = phase.backward;
  hooks.param = [&s, backward](uint32_t i, DLTensor *out) {
    return view(s, i, false, backward, out);
  };
  hooks.grad = [&s, backward](uint32_t i, DLTensor *out) {
    if (!s.training)
      return s.host.table()->error(s.host.ctx(), TSR_ERR_INVALID,
                                   "no gradients: the model is frozen");
    return view(s, i, true, backward, out);
  };
  // A frozen layout group's grads_done only releases its parameters
  // (stage 3); it has no update to start.
  hooks.grads_done = [&s, last = phase.last_micro, final = phase.grads_final](uint32_t mg) {
    uint32_t first = 0, end = 0;
    tsr_status st = groups_of(s, mg, &first, &end);
    for (uint32_t g = first; st == TSR_OK && g <= end; ++g) {
      st = s.zero.vt->grads_done(s.zero.self, g, last ? 1 : 0);
      if (st == TSR_OK && last && final && !s.layout.group_frozen[g]) st = final(g);
    }
    return st;
  };
  hooks.grads_zeroed = [zeroed = backward && phase.grads_zero] { return zeroed; };
  hooks.update = phase.update;
  hooks.micro = phase.micro;
  hooks.params_done = [&s](uint32_t mg) {
    uint32_t first = 0, last = 0;
    tsr_status st = groups_of(s, mg, &first, &last);
    for (uint32_t g = first; st == TSR_OK && g <= last; ++g)
      st = s.zero.vt->params_done(s.zero.self, g);
    return st;
  };
}

}  // namespace tessera
