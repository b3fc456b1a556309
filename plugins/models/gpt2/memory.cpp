// The gpt2 model's memory: the activation plan (offsets into the two
// allocations made once at create), their allocation in the compute dtype,
// and the host's views of parameters and gradients.
#include <string>

#include "gpt2.hpp"

namespace tessera::gpt2 {

// ---- memory -----------------------------------------------------------------

void Gpt2::plan_memory() {
  const size_t R = static_cast<size_t>(max_batch * d.context);
  const size_t C = static_cast<size_t>(d.width), H = static_cast<size_t>(d.heads);
  auto take = [](size_t &cursor, size_t n) {
    const size_t at = cursor;
    cursor += (n + 63) / 64 * 64;  // 256-byte aligned in float32
    return at;
  };
  size_t a = 0, s = 0;
  resid.clear();
  for (uint32_t l = 0; l <= L(); ++l) resid.push_back(take(a, R * C));
  sets.assign(recompute ? 1 : L(), Set{});
  for (Set &x : sets) {
    x.ln1 = take(a, R * C);
    x.qkv = take(a, 3 * R * C);
    x.atty = take(a, R * C);
    x.r2 = take(a, R * C);
    x.ln2 = take(a, R * C);
    x.fch = take(a, 4 * R * C);
    x.fchg = recompute_gelu ? 0 : take(a, 4 * R * C);  // else dbig, below
    x.m1 = take(s, R);
    x.s1 = take(s, R);
    x.m2 = take(s, R);
    x.s2 = take(s, R);
    x.lse = take(s, H * R);
  }
  lnf = take(a, R * C);
  logits = take(a, R * static_cast<size_t>(d.padded_vocab));
  dres = take(a, R * C);
  dsmall = take(a, R * C);
  dbig = take(a, 4 * R * C);
  // recompute_gelu: every block's GELU output lives in dbig, which forward
  // does not otherwise use and backward reads it from before overwriting.
  if (recompute_gelu)
    for (Set &x : sets) x.fchg = dbig;
  discard = take(a, 2 * C);
  lnf_m = take(s, R);
  lnf_s = take(s, R);
  act_elems = a;
  stats_elems = s;
}

void Gpt2::allocate(DLDataType dtype) {
  act.reset();
  stats.reset();
  adt = dtype;
  esize = static_cast<size_t>(dtype.bits / 8);
  act = Buffer(host, device, act_elems * esize, TSR_MEM_ACTIVATIONS);
  stats = Buffer(host, device, stats_elems * 4, TSR_MEM_ACTIVATIONS);
}

// Parameters come in the compute dtype the host chose; activations follow.
void Gpt2::ensure_dtype(const DLTensor &p) {
  if (same_dtype(p.dtype, adt)) return;
  if (p.dtype.lanes != 1 || !(p.dtype.code == kDLFloat || p.dtype.code == kDLBfloat) ||
      !(p.dtype.bits == 32 || p.dtype.bits == 16))
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: parameters are " + dtype_name(p.dtype) +
                    "; the gpt2 model computes in float32, bfloat16 or float16");
  const std::string msg = "gpt2: the parameters are " + dtype_name(p.dtype) +
                          ", not the expected " + dtype_name(adt) +
                          "; reallocating the activations";
  host->log(host->ctx, TSR_LOG_WARN, msg.c_str());
  allocate(p.dtype);
}

// ---- parameters -------------------------------------------------------------

DLTensor Gpt2::view_of(tsr_step *step, uint32_t index, bool grad) const {
  return sdk::step_tensor(host, step, index, grad, infos[index], "gpt2");
}

// The gradient of a trainable parameter, or a zeroed scratch of its size
// for a frozen one (layernorm_backward always writes dweight and dbias).
View Gpt2::grad_or_discard(tsr_step *step, uint32_t index, int which) {
  if (trainable(index)) return View(grad(step, index), {d.width});
  View v = A(discard + static_cast<size_t>(which * d.width), {d.width});
  check(ops->fill(host->ctx, v.get(), 0.0f));
  return v;
}

}  // namespace tessera::gpt2
