// Grouped-query causal attention on CUDA (ABI 1.6's attention_gqa_*): q,
// out [B, T, H, D], k, v [B, T, Hk, D], query head h reading key/value head
// h / (H / Hk). With Hk = H it is the multi-head entry (attention_select.cpp)
// unchanged. Otherwise bf16/fp16 go to cuDNN's fused flash attention, which
// takes the grouped K and V as they are, where it builds a plan for the
// call (TESSERA_ATTENTION as for the multi-head entry, docs/gpu.md). Else
// the forward runs the engine's flash kernels, which read each key/value
// head in place for its group; the backward runs the multi-head entry
// (cuDNN or the kernels) on K and V repeated per query head, the gradients
// of the copies then summed over each group (attention_gqa_kernels.cu).
//
// ABI 1.8's attention_packed_* (document masking by positions) always run
// the engine's kernels, K and V read in place, backward's dk and dv per
// query head summed over each group: cuDNN's form for packed sequences
// (its ragged layout) wants each document's offsets and lengths as device
// tensors, which per-query positions do not give without a scan of every
// batch; TESSERA_ATTENTION=cudnn therefore refuses these calls, and auto
// logs once that they run the engine's kernels.
#include <cmath>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/attention_cudnn.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/ops_decoder.hpp"

namespace tessera::cuda {

namespace {

using attn::Bthd;
using attn::Dims;
using attn::Dt;

// Device memory for one call from the caching allocator, given back once
// the call is enqueued (the allocator reuses blocks in stream order).
struct GqaBuffer {
  void *p = nullptr;
  explicit GqaBuffer(size_t bytes) : p(bytes ? device_alloc(bytes) : nullptr) {}
  ~GqaBuffer() {
    if (p) device_free(p);
  }
  GqaBuffer(const GqaBuffer &) = delete;
  GqaBuffer &operator=(const GqaBuffer &) = delete;
};

// A compact [B, T, H, D] DLTensor header over `p` (the copies the
// multi-head kernels read and write).
struct GqaCompact {
  int64_t dims[4];
  DLTensor t{};
  GqaCompact(void *p, const DLTensor *like, const Dims &d) : dims{d.B, d.T, d.H, d.D} {
    t = *like;
    t.data = p;
    t.byte_offset = 0;
    t.ndim = 4;
    t.shape = dims;
    t.strides = nullptr;
  }
};

// The checked views of one call: q's dims in d, k's head count in hk.
struct GqaChecked {
  Dims d;
  Dt dt = Dt::F32;
  int64_t hk = 0;
};

// k (and every key/value-shaped argument after it) against q's B, T, D,
// dtype, with a head count that divides q's.
Bthd gqa_check_kv(const char *op, const char *arg, const DLTensor *t, GqaChecked &c, bool first) {
  Dims dk;
  Dt dt = Dt::F32;
  const Bthd v = attn::check_bthd(op, arg, t, dk, dt, true);
  TSR_CHECK(
      dk.B == c.d.B && dk.T == c.d.T && dk.D == c.d.D && dt == c.dt, TSR_ERR_INVALID,
      std::string(op) + ": " + arg + " " + describe(t) + " must match the B, T, D and dtype of q");
  if (first) {
    TSR_CHECK(dk.H > 0 ? c.d.H % dk.H == 0 : c.d.H == 0, TSR_ERR_INVALID,
              std::string(op) + ": " + arg + " " + describe(t) + " has " + std::to_string(dk.H) +
                  " heads, which must divide q's " + std::to_string(c.d.H));
    c.hk = dk.H;
  } else {
    TSR_CHECK(dk.H == c.hk, TSR_ERR_INVALID,
              std::string(op) + ": " + arg + " " + describe(t) + " must have k's " +
                  std::to_string(c.hk) + " heads");
  }
  return v;
}

std::string gqa_describe(const GqaChecked &c) {
  return "[B=" + std::to_string(c.d.B) + ",T=" + std::to_string(c.d.T) +
         ",H=" + std::to_string(c.d.H) + ",Hk=" + std::to_string(c.hk) +
         ",D=" + std::to_string(c.d.D) + "] " + attn::dt_name(c.dt);
}

size_t gqa_heads_bytes(const GqaChecked &c) {
  return static_cast<size_t>(c.d.B * c.d.T * c.d.H * c.d.D) * (c.dt == Dt::F32 ? 4 : 2);
}

void gqa_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k, const DLTensor *v,
                 float scale, DLTensor *out, DLTensor *lse) {
  constexpr const char *op = "attention_gqa_forward";
  if (side_of(op, {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}}) == Side::Host) {
    AsCpu hq(q), hk(k), hv(v), ho(out), hl(lse);
    host_result(need_cpu(cpu_ops()->attention_gqa_forward, op)(ctx, hq.p, hk.p, hv.p, scale,
                                                               ho.mut(), hl.mut()));
    return;
  }
  GqaChecked c;
  const Bthd vq = attn::check_bthd(op, "q", q, c.d, c.dt, true);
  const Bthd vk = gqa_check_kv(op, "k", k, c, true), vv = gqa_check_kv(op, "v", v, c, false);
  Dims dout = c.d;
  const Bthd vo = attn::check_bthd(op, "out", out, dout, c.dt, false);
  float *plse = attn::check_lse(op, lse, c.d);
  attn::check_dims(op, c.d);
  TSR_CHECK(std::isfinite(scale), TSR_ERR_INVALID, std::string(op) + ": scale is not finite");
  if (c.hk == c.d.H) {  // multi-head: the 1.1 entry, its choice of implementation
    host_result(attention_forward(ctx, q, k, v, scale, out, lse));
    return;
  }
  if (c.d.B * c.d.T * c.d.H == 0) return;
  const AttnImpl impl = attention_env_impl();
  if (impl != AttnImpl::Native && c.dt != Dt::F32) {
    std::string why;
    if (attn::cudnn_forward(attn::FwdArgs{c.d, c.dt, vq, vk, vv, vo, plse, scale, c.hk}, &why))
      return;
    attention_declined(impl, op, gqa_describe(c), why);
  }
  // The kernels read each key/value head in place for its group.
  host_result(attention_forward_native(ctx, q, k, v, scale, out, lse, nullptr, c.d.H / c.hk));
}

// A backward whose dK and dV come per query head: `run(dk, dv)` writes them
// into scratch of q's heads, then summed over each group into dk and dv.
template <typename Run>
void grads_per_query_head(const GqaChecked &c, DLTensor *dk, DLTensor *dv, const Bthd &vdk,
                          const Bthd &vdv, Run &&run) {
  const int64_t group = c.d.H / c.hk;
  const size_t bytes = gqa_heads_bytes(c);
  GqaBuffer dkx(bytes), dvx(bytes);
  GqaCompact tdk(dkx.p, dk, c.d), tdv(dvx.p, dv, c.d);
  run(&tdk.t, &tdv.t);
  launch_gqa_group_sum(dkx.p, c.dt, vdk, c.d.B, c.d.T, c.hk, c.d.D, group);
  launch_gqa_group_sum(dvx.p, c.dt, vdv, c.d.B, c.d.T, c.hk, c.d.D, group);
}

// Backward on key and value heads repeated per query head: `run(k, v, dk,
// dv)` is the multi-head backward on the copies (2 x group x the K/V bytes
// more), its gradients summed as grads_per_query_head does.
template <typename Run>
void backward_on_repeated_heads(const GqaChecked &c, const DLTensor *k, const DLTensor *v,
                                DLTensor *dk, DLTensor *dv, const Bthd &vk, const Bthd &vv,
                                const Bthd &vdk, const Bthd &vdv, Run &&run) {
  const int64_t group = c.d.H / c.hk;
  const size_t bytes = gqa_heads_bytes(c);
  GqaBuffer kx(bytes), vx(bytes);
  launch_gqa_expand(vk, c.dt, kx.p, c.d.B, c.d.T, c.d.H, c.d.D, group);
  launch_gqa_expand(vv, c.dt, vx.p, c.d.B, c.d.T, c.d.H, c.d.D, group);
  GqaCompact tk(kx.p, k, c.d), tv(vx.p, v, c.d);
  grads_per_query_head(c, dk, dv, vdk, vdv,
                       [&](DLTensor *rdk, DLTensor *rdv) { run(&tk.t, &tv.t, rdk, rdv); });
}

// Checks every argument (reported by name), then the multi-head backward
// on repeated heads.
void gqa_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k, const DLTensor *v,
                  const DLTensor *out, const DLTensor *dout, const DLTensor *lse, float scale,
                  DLTensor *dq, DLTensor *dk, DLTensor *dv) {
  constexpr const char *op = "attention_gqa_backward";
  if (side_of(op, {{"q", q},
                   {"k", k},
                   {"v", v},
                   {"out", out},
                   {"dout", dout},
                   {"lse", lse},
                   {"dq", dq},
                   {"dk", dk},
                   {"dv", dv}}) == Side::Host) {
    AsCpu hq(q), hk(k), hv(v), ho(out), hdo(dout), hl(lse), hdq(dq), hdk(dk), hdv(dv);
    host_result(need_cpu(cpu_ops()->attention_gqa_backward, op)(
        ctx, hq.p, hk.p, hv.p, ho.p, hdo.p, hl.p, scale, hdq.mut(), hdk.mut(), hdv.mut()));
    return;
  }
  GqaChecked c;
  attn::check_bthd(op, "q", q, c.d, c.dt, true);
  const Bthd vk = gqa_check_kv(op, "k", k, c, true), vv = gqa_check_kv(op, "v", v, c, false);
  const Bthd vdk = gqa_check_kv(op, "dk", dk, c, false), vdv = gqa_check_kv(op, "dv", dv, c, false);
  Dims same = c.d;
  attn::check_bthd(op, "out", out, same, c.dt, false);
  attn::check_bthd(op, "dout", dout, same, c.dt, false);
  attn::check_bthd(op, "dq", dq, same, c.dt, false);
  attn::check_lse(op, lse, c.d);
  attn::check_dims(op, c.d);
  TSR_CHECK(std::isfinite(scale), TSR_ERR_INVALID, std::string(op) + ": scale is not finite");
  if (c.hk == c.d.H) {
    host_result(attention_backward(ctx, q, k, v, out, dout, lse, scale, dq, dk, dv));
    return;
  }
  if (c.d.B * c.d.T * c.d.H == 0) return;
  // Through the multi-head entry (cuDNN or the kernels, as it chooses) on
  // repeated heads. cuDNN's own grouped graph (full-head fp32 dK/dV reduced
  // over the group, as its frontend writes it) gave wrong dK and dV on an
  // H100 with cuDNN 9.19 (relative error 1.2 against the CPU in bf16 and
  // fp16, tests/gpu/test_cuda_decoder.cpp), so it is not used.
  backward_on_repeated_heads(
      c, k, v, dk, dv, vk, vv, vdk, vdv,
      [&](const DLTensor *rk, const DLTensor *rv, DLTensor *rdk, DLTensor *rdv) {
        host_result(attention_backward(ctx, q, rk, rv, out, dout, lse, scale, dq, rdk, rdv));
      });
}

// positions int32 [B, T] on the device, compact: its data for the kernels.
const int32_t *packed_positions(const char *op, const DLTensor *positions, const Dims &d) {
  TSR_CHECK(positions != nullptr, TSR_ERR_INVALID, std::string(op) + ": positions is NULL");
  const View P = i32(op, "positions", positions);
  TSR_CHECK(positions->ndim == 2 && positions->shape[0] == d.B && positions->shape[1] == d.T,
            TSR_ERR_INVALID,
            std::string(op) + ": positions " + describe(positions) + " must be [B, T] = [" +
                std::to_string(d.B) + "," + std::to_string(d.T) + "]");
  return P.as<int32_t>();
}

// cuDNN is not asked (see the top): an error where TESSERA_ATTENTION=cudnn
// demands it for bf16/fp16, a log line once in auto mode.
void packed_skips_cudnn(const char *op, const GqaChecked &c) {
  const AttnImpl impl = attention_env_impl();
  if (impl != AttnImpl::Native && c.dt != Dt::F32)
    attention_declined(impl, op, gqa_describe(c),
                       "document masking (positions) is not taken to cuDNN");
}

void packed_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k, const DLTensor *v,
                    const DLTensor *positions, float scale, DLTensor *out, DLTensor *lse) {
  constexpr const char *op = "attention_packed_forward";
  if (side_of(
          op,
          {{"q", q}, {"k", k}, {"v", v}, {"positions", positions}, {"out", out}, {"lse", lse}}) ==
      Side::Host) {
    AsCpu hq(q), hk(k), hv(v), hp(positions), ho(out), hl(lse);
    host_result(need_cpu(cpu_ops()->attention_packed_forward, op)(ctx, hq.p, hk.p, hv.p, hp.p,
                                                                  scale, ho.mut(), hl.mut()));
    return;
  }
  GqaChecked c;
  attn::check_bthd(op, "q", q, c.d, c.dt, true);
  gqa_check_kv(op, "k", k, c, true);
  gqa_check_kv(op, "v", v, c, false);
  Dims dout = c.d;
  attn::check_bthd(op, "out", out, dout, c.dt, false);
  attn::check_lse(op, lse, c.d);
  attn::check_dims(op, c.d);
  TSR_CHECK(std::isfinite(scale), TSR_ERR_INVALID, std::string(op) + ": scale is not finite");
  const int32_t *pos = packed_positions(op, positions, c.d);
  if (c.d.B * c.d.T * c.d.H == 0) return;
  packed_skips_cudnn(op, c);
  if (c.hk == c.d.H) {
    host_result(attention_forward_native(ctx, q, k, v, scale, out, lse, pos));
    return;
  }
  // The kernels read each key/value head in place for its group.
  host_result(attention_forward_native(ctx, q, k, v, scale, out, lse, pos, c.d.H / c.hk));
}

// long-function: the checks of ten arguments by name, then the multi-head
// call or the grouped one (K and V in place, dK and dV summed per group).
void packed_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k, const DLTensor *v,
                     const DLTensor *positions, const DLTensor *out, const DLTensor *dout,
                     const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk, DLTensor *dv) {
  constexpr const char *op = "attention_packed_backward";
  if (side_of(op, {{"q", q},
                   {"k", k},
                   {"v", v},
                   {"positions", positions},
                   {"out", out},
                   {"dout", dout},
                   {"lse", lse},
                   {"dq", dq},
                   {"dk", dk},
                   {"dv", dv}}) == Side::Host) {
    AsCpu hq(q), hk(k), hv(v), hp(positions), ho(out), hdo(dout), hl(lse), hdq(dq), hdk(dk),
        hdv(dv);
    host_result(need_cpu(cpu_ops()->attention_packed_backward, op)(
        ctx, hq.p, hk.p, hv.p, hp.p, ho.p, hdo.p, hl.p, scale, hdq.mut(), hdk.mut(), hdv.mut()));
    return;
  }
  GqaChecked c;
  attn::check_bthd(op, "q", q, c.d, c.dt, true);
  gqa_check_kv(op, "k", k, c, true);
  gqa_check_kv(op, "v", v, c, false);
  const Bthd vdk = gqa_check_kv(op, "dk", dk, c, false), vdv = gqa_check_kv(op, "dv", dv, c, false);
  Dims same = c.d;
  attn::check_bthd(op, "out", out, same, c.dt, false);
  attn::check_bthd(op, "dout", dout, same, c.dt, false);
  attn::check_bthd(op, "dq", dq, same, c.dt, false);
  attn::check_lse(op, lse, c.d);
  attn::check_dims(op, c.d);
  TSR_CHECK(std::isfinite(scale), TSR_ERR_INVALID, std::string(op) + ": scale is not finite");
  const int32_t *pos = packed_positions(op, positions, c.d);
  if (c.d.B * c.d.T * c.d.H == 0) return;
  packed_skips_cudnn(op, c);
  if (c.hk == c.d.H) {
    host_result(attention_backward_native(ctx, q, k, v, out, dout, lse, scale, dq, dk, dv, pos));
    return;
  }
  // K and V read in place; dk and dv per query head, summed over each group.
  grads_per_query_head(c, dk, dv, vdk, vdv, [&](DLTensor *rdk, DLTensor *rdv) {
    host_result(attention_backward_native(ctx, q, k, v, out, dout, lse, scale, dq, rdk, rdv, pos,
                                          c.d.H / c.hk));
  });
}

}  // namespace

tsr_status attention_packed_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                    const DLTensor *v, const DLTensor *positions, float scale,
                                    DLTensor *out, DLTensor *lse) noexcept {
  return guarded(ctx, [&] { packed_forward(ctx, q, k, v, positions, scale, out, lse); });
}

tsr_status attention_packed_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                     const DLTensor *v, const DLTensor *positions,
                                     const DLTensor *out, const DLTensor *dout, const DLTensor *lse,
                                     float scale, DLTensor *dq, DLTensor *dk,
                                     DLTensor *dv) noexcept {
  return guarded(
      ctx, [&] { packed_backward(ctx, q, k, v, positions, out, dout, lse, scale, dq, dk, dv); });
}

tsr_status attention_gqa_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                 const DLTensor *v, float scale, DLTensor *out,
                                 DLTensor *lse) noexcept {
  return guarded(ctx, [&] { gqa_forward(ctx, q, k, v, scale, out, lse); });
}

tsr_status attention_gqa_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                                  const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                                  const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                                  DLTensor *dv) noexcept {
  return guarded(ctx, [&] { gqa_backward(ctx, q, k, v, out, dout, lse, scale, dq, dk, dv); });
}

}  // namespace tessera::cuda
