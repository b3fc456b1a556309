// The llama model's memory: the activation plan (offsets into allocations
// made once at create), their allocation in the compute dtype, the
// positions buffer, and the host's views of parameters and gradients.
#include <algorithm>
#include <string>

#include "llama.hpp"

namespace tessera::llama {

void Llama::plan_memory() {
  const size_t R = static_cast<size_t>(max_batch * a.max_seq);
  const size_t C = static_cast<size_t>(a.width), F = static_cast<size_t>(a.intermediate);
  const size_t Q = static_cast<size_t>(QD()), K = static_cast<size_t>(KD());
  const size_t Hq = static_cast<size_t>(a.heads), Hk = static_cast<size_t>(a.kv_heads);
  const auto aligned = [](size_t n) { return (n + 63) / 64 * 64; };  // 256 bytes in float32
  const auto take = [&](size_t &cursor, size_t n) {
    const size_t at = cursor;
    cursor += aligned(n);
    return at;
  };
  // The logits live from the LM head's forward to its backward; the
  // layers' backward scratch, and swiglu's output where the layers share
  // one, only outside that window (the last layer's backward computes that
  // output again, layer_backward). One region holds whichever is larger: a
  // Qwen2.5-0.5B step at 4 x 2048 keeps 0.3 GiB less, a Llama-3.2-1B one
  // 0.6 GiB.
  size_t y = 0;
  // With recompute_swiglu (by default on GPUs) swiglu's output, [R,
  // intermediate], is one buffer for every layer: the down projection's
  // weight gradient reads it again from gate and up (layer_backward: from
  // ABI 1.12 the gradient pass writes it, swiglu_backward_out; before, an
  // elementwise pass of its own, 2.6 ms of a 130 ms Llama-3.2-1B step at 4
  // x 2048 against 2 GiB kept). On the CPU, where memory is
  // the cheaper of the two, each layer keeps its own by default. It comes
  // first in the region, where even a tiny model's logits overwrite it, so
  // the golden tests catch a backward that reads it stale.
  const size_t act_shared = recompute_swiglu ? take(y, R * F) : 0;
  dq = take(y, R * Q);
  dk = take(y, R * K);
  dv = take(y, R * K);
  dout = take(y, R * Q);
  dqraw = a.qk_norm ? take(y, R * Q) : 0;
  dkraw = a.qk_norm ? take(y, R * K) : 0;
  dgate = take(y, R * F);
  dup = take(y, R * F);
  dact = take(y, R * F);
  logits = 0;
  size_t x = std::max(y, aligned(R * static_cast<size_t>(a.vocab))), s = 0;
  resid.clear();
  for (uint32_t l = 0; l <= L(); ++l) resid.push_back(take(x, R * C));
  sets.assign(recompute ? 1 : L(), Set{});
  for (Set &e : sets) {
    e.h1 = take(x, R * C);
    e.qraw = a.qk_norm ? take(x, R * Q) : 0;
    e.kraw = a.qk_norm ? take(x, R * K) : 0;
    e.q = take(x, R * Q);
    e.k = take(x, R * K);
    e.v = take(x, R * K);
    e.o = take(x, R * Q);
    e.r = take(x, R * C);
    e.h2 = take(x, R * C);
    e.gate = take(x, R * F);
    e.up = take(x, R * F);
    e.act = recompute_swiglu ? act_shared : take(x, R * F);
    e.rstd1 = take(s, R);
    e.rstd2 = take(s, R);
    e.rstdq = a.qk_norm ? take(s, R * Hq) : 0;
    e.rstdk = a.qk_norm ? take(s, R * Hk) : 0;
    e.lse = take(s, R * Hq);
  }
  hf = take(x, R * C);
  dres = take(x, R * C);
  dsm = take(x, R * C);
  discard = take(x, std::max(C, static_cast<size_t>(a.head_dim)));  // frozen norms' gradient
  rstdf = take(s, R);
  act_elems = x;
  stats_elems = s;
}

void Llama::allocate(DLDataType dtype) {
  act.reset();
  stats.reset();
  adt = dtype;
  esize = static_cast<size_t>(dtype.bits / 8);
  act = Buffer(host, device, act_elems * esize, TSR_MEM_ACTIVATIONS);
  stats = Buffer(host, device, stats_elems * 4, TSR_MEM_ACTIVATIONS);
  lora_allocate(*this);
  if (!pos.get())
    pos = Buffer(host, device, static_cast<size_t>(max_batch * a.max_seq) * 4, TSR_MEM_ACTIVATIONS);
}

// Parameters come in the compute dtype the host chose; activations follow.
void Llama::ensure_dtype(const DLTensor &p) {
  if (same_dtype(p.dtype, adt)) return;
  if (p.dtype.lanes != 1 || !(p.dtype.code == kDLFloat || p.dtype.code == kDLBfloat) ||
      !(p.dtype.bits == 32 || p.dtype.bits == 16))
    throw Error(TSR_ERR_UNSUPPORTED, "llama: parameters are " + dtype_name(p.dtype) +
                                         "; the llama model computes in float32, bfloat16 or "
                                         "float16");
  const std::string msg = "llama: the parameters are " + dtype_name(p.dtype) + ", not " +
                          dtype_name(adt) + "; reallocating the activations";
  host->log(host->ctx, TSR_LOG_WARN, msg.c_str());
  allocate(p.dtype);
}

// Positions 0..T-1 of each of B sequences, int32 [B, T] on the device:
// written from the host when (B, T) changes (a copy across when the
// device is not the CPU).
View Llama::positions(int64_t B, int64_t T) {
  View v(pos.get(), 0, device, sdk::dtype_i32(), {B, T});
  if (B == pos_B && T == pos_T) return v;
  pos_host.resize(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      pos_host[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(t);
  View src(pos_host.data(), 0, DLDevice{kDLCPU, 0}, sdk::dtype_i32(), {B, T});
  check(ops->copy(host->ctx, src.get(), v.get()));
  pos_B = B;
  pos_T = T;
  return v;
}

View Llama::token_positions(int64_t B, int64_t T) {
  if (packed) return View(packed_pos, {B, T});
  return positions(B, T);
}

View Llama::norm_grad(tsr_step *step, uint32_t index, int64_t n) const {
  if (trainable(index)) return View(grad(step, index), {n});
  // A frozen norm's weight gradient: none from ABI 1.11 (rmsnorm_backward
  // takes a NULL dweight and skips the column sums); before, a scratch
  // the op adds into and nobody reads.
  if (host->abi_major > 1 || host->abi_minor >= 11) return View();
  View scratch = A(discard, {n});
  check(ops->fill(host->ctx, scratch.get(), 0.0f));
  return scratch;
}

DLTensor Llama::view_of(tsr_step *step, uint32_t index, bool grad) const {
  return sdk::step_tensor(host, step, index, grad, infos[index], "llama");
}

}  // namespace tessera::llama
