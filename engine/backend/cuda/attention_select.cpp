// Which causal attention runs: cuDNN's fused flash attention where the
// library is present and builds a plan for the call, the engine's own flash
// kernels otherwise. TESSERA_ATTENTION picks (docs/gpu.md):
//
//   auto (default)  cuDNN for bf16/fp16 where it takes the call, else ours
//   native          always ours
//   cudnn           cuDNN for bf16/fp16, an error where it cannot; fp32
//                   stays ours (cuDNN has no fp32 flash attention)
//
// An environment variable and not a config key: the ops table is a
// process-wide C ABI that plugins call with no run settings in reach, and
// the launcher passes TESSERA_* on to every rank (docs/multi-node.md).
// The first call logs which implementation the process uses; in auto mode,
// each shape cuDNN declines is logged once with the reason.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <mutex>
#include <set>

#include "backend/cuda/attention_cudnn.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"

namespace tessera::cuda {

namespace {

using attn::Bthd;
using attn::Dims;
using attn::Dt;

AttnImpl env_mode() {
  static const std::string v = [] {
    const char *e = std::getenv("TESSERA_ATTENTION");
    return std::string(e ? e : "");
  }();
  if (v.empty() || v == "auto") return AttnImpl::Auto;
  if (v == "native") return AttnImpl::Native;
  if (v == "cudnn") return AttnImpl::Cudnn;
  throw Error(TSR_ERR_INVALID, "TESSERA_ATTENTION=" + v + ": expected auto, native or cudnn");
}

void announce(AttnImpl impl) {
  static std::once_flag once;
  std::call_once(once, [impl] {
    std::string what;
    const bool ok = attn::cudnn_available(&what);
    if (impl == AttnImpl::Native) {
      spdlog::info("attention: the engine's flash kernels (TESSERA_ATTENTION=native)");
    } else if (ok) {
      spdlog::info(
          "attention: {} fused flash attention for bf16/fp16{}", what,
          impl == AttnImpl::Auto ? " where it builds (TESSERA_ATTENTION=native: ours)" : "");
    } else {
      spdlog::info("attention: the engine's flash kernels ({})", what);
    }
  });
}

void log_once(const std::string &msg) {
  static std::mutex mu;
  static auto *seen = new std::set<std::string>;
  std::lock_guard<std::mutex> lock(mu);
  if (seen->insert(msg).second) spdlog::info("{}", msg);
}

std::string shape(const Dims &d, Dt dt) {
  return "[B=" + std::to_string(d.B) + ",T=" + std::to_string(d.T) + ",H=" + std::to_string(d.H) +
         ",D=" + std::to_string(d.D) + "] " + attn::dt_name(dt);
}

// After cuDNN declined: an error when cuDNN was demanded, else a log line
// (table calls only; tests and benches asking for auto know what they get).
void declined(AttnImpl impl, bool table, const char *dir, const Dims &d, Dt dt,
              const std::string &why) {
  TSR_CHECK(impl != AttnImpl::Cudnn, TSR_ERR_UNSUPPORTED,
            std::string("attention_") + dir + ": cuDNN cannot take " + shape(d, dt) + ": " + why);
  if (table)
    log_once(std::string("attention: ") + dir + " " + shape(d, dt) +
             " runs the engine's kernels (cuDNN: " + why + ")");
}

tsr_status forward(AttnImpl impl, bool table, tsr_host_ctx *ctx, const DLTensor *q,
                   const DLTensor *k, const DLTensor *v, float scale, DLTensor *out,
                   DLTensor *lse) noexcept {
  return guarded(ctx, [&] {
    if (impl != AttnImpl::Native) {
      // The native entry's checks, so cuDNN sees validated views.
      const char *op = "attention_forward";
      Dims d;
      Dt dt = Dt::F32;
      const Bthd vq = attn::check_bthd(op, "q", q, d, dt, true);
      const Bthd vk = attn::check_bthd(op, "k", k, d, dt, false);
      const Bthd vv = attn::check_bthd(op, "v", v, d, dt, false);
      const Bthd vo = attn::check_bthd(op, "out", out, d, dt, false);
      float *plse = attn::check_lse(op, lse, d);
      attn::check_dims(op, d);
      TSR_CHECK(std::isfinite(scale), TSR_ERR_INVALID, "attention_forward: scale is not finite");
      if (d.B * d.T * d.H == 0) return;
      if (dt != Dt::F32) {
        std::string why;
        if (attn::cudnn_forward(attn::FwdArgs{d, dt, vq, vk, vv, vo, plse, scale}, &why)) return;
        declined(impl, table, "forward", d, dt, why);
      }
    }
    host_result(attention_forward_native(ctx, q, k, v, scale, out, lse));
  });
}

tsr_status backward(AttnImpl impl, bool table, tsr_host_ctx *ctx, const DLTensor *q,
                    const DLTensor *k, const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                    const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                    DLTensor *dv) noexcept {
  return guarded(ctx, [&] {
    if (impl != AttnImpl::Native) {
      const char *op = "attention_backward";
      Dims d;
      Dt dt = Dt::F32;
      const Bthd vq = attn::check_bthd(op, "q", q, d, dt, true);
      const Bthd vk = attn::check_bthd(op, "k", k, d, dt, false);
      const Bthd vv = attn::check_bthd(op, "v", v, d, dt, false);
      const Bthd vo = attn::check_bthd(op, "out", out, d, dt, false);
      const Bthd vdo = attn::check_bthd(op, "dout", dout, d, dt, false);
      const Bthd vdq = attn::check_bthd(op, "dq", dq, d, dt, false);
      const Bthd vdk = attn::check_bthd(op, "dk", dk, d, dt, false);
      const Bthd vdv = attn::check_bthd(op, "dv", dv, d, dt, false);
      const float *plse = attn::check_lse(op, lse, d);
      attn::check_dims(op, d);
      TSR_CHECK(std::isfinite(scale), TSR_ERR_INVALID, "attention_backward: scale is not finite");
      if (d.B * d.T * d.H == 0) return;
      if (dt != Dt::F32) {
        std::string why;
        const attn::BwdArgs a{d, dt, vq, vk, vv, vo, vdo, vdq, vdk, vdv, plse, scale};
        if (attn::cudnn_backward(a, &why)) return;
        declined(impl, table, "backward", d, dt, why);
      }
    }
    host_result(attention_backward_native(ctx, q, k, v, out, dout, lse, scale, dq, dk, dv));
  });
}

}  // namespace

tsr_status attention_forward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                             const DLTensor *v, float scale, DLTensor *out,
                             DLTensor *lse) noexcept {
  AttnImpl impl = AttnImpl::Auto;
  const tsr_status s = guarded(ctx, [&] {
    impl = env_mode();
    announce(impl);
  });
  if (s != TSR_OK) return s;
  return forward(impl, true, ctx, q, k, v, scale, out, lse);
}

tsr_status attention_backward(tsr_host_ctx *ctx, const DLTensor *q, const DLTensor *k,
                              const DLTensor *v, const DLTensor *out, const DLTensor *dout,
                              const DLTensor *lse, float scale, DLTensor *dq, DLTensor *dk,
                              DLTensor *dv) noexcept {
  AttnImpl impl = AttnImpl::Auto;
  const tsr_status s = guarded(ctx, [&] {
    impl = env_mode();
    announce(impl);
  });
  if (s != TSR_OK) return s;
  return backward(impl, true, ctx, q, k, v, out, dout, lse, scale, dq, dk, dv);
}

tsr_status attention_forward_with(AttnImpl impl, tsr_host_ctx *ctx, const DLTensor *q,
                                  const DLTensor *k, const DLTensor *v, float scale, DLTensor *out,
                                  DLTensor *lse) noexcept {
  return forward(impl, false, ctx, q, k, v, scale, out, lse);
}

tsr_status attention_backward_with(AttnImpl impl, tsr_host_ctx *ctx, const DLTensor *q,
                                   const DLTensor *k, const DLTensor *v, const DLTensor *out,
                                   const DLTensor *dout, const DLTensor *lse, float scale,
                                   DLTensor *dq, DLTensor *dk, DLTensor *dv) noexcept {
  return backward(impl, false, ctx, q, k, v, out, dout, lse, scale, dq, dk, dv);
}

AttnImpl attention_env_impl() {
  const AttnImpl impl = env_mode();
  announce(impl);
  return impl;
}

void attention_declined(AttnImpl impl, const char *op, const std::string &shape,
                        const std::string &why) {
  TSR_CHECK(impl != AttnImpl::Cudnn, TSR_ERR_UNSUPPORTED,
            std::string(op) + ": cuDNN cannot take " + shape + ": " + why);
  log_once(std::string(op) + " " + shape + " runs the engine's kernels (cuDNN: " + why + ")");
}

bool attention_cudnn_available(std::string *what) {
  return attn::cudnn_available(what);
}

}  // namespace tessera::cuda
