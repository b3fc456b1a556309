// Causal attention through cuDNN's fused flash attention (cuDNN 9, backend
// API, loaded at run time), behind the same interface as the engine's
// kernels: q, k, v, out [B, T, H, D] with their strides, lse [B, H, T] fp32.
//
// lse is the natural-log log-sum-exp of each row's scaled, masked scores,
// lse[b,h,t] = max_j s_j + ln sum_j exp(s_j - max_j s_j), s_j = scale q_t.k_j,
// j <= t: exactly what cuDNN's softmax "stats" output holds ([b, h, s_q, 1],
// fp32, compact), so the buffer is bound to cuDNN directly and a forward of
// either implementation feeds a backward of either.
//
// No cuDNN types here: the file is included by code built without cuDNN's
// headers (attention_select.cpp, tests), and TESSERA_HAVE_CUDNN is private
// to the engine's cuDNN sources.
#pragma once

#include <string>

#include "backend/cuda/attention.cuh"

namespace tessera::cuda::attn {

// hk: key/value heads (ABI 1.6's grouped-query attention: k and v are
// [B, T, hk, D], query head h reads head h / (H / hk)); 0 means d.H.
struct FwdArgs {
  Dims d;
  Dt dt;
  Bthd q, k, v, o;
  float *lse;
  float scale;
  int64_t hk = 0;
};

struct BwdArgs {
  Dims d;
  Dt dt;
  Bthd q, k, v, o, dout, dq, dk, dv;
  const float *lse;
  float scale;
  int64_t hk = 0;
};

// True when cuDNN can serve calls in this process; *what says which cuDNN
// ("cuDNN 9.19.0 (libcudnn.so.9)") or why not.
bool cudnn_available(std::string *what);

// Enqueue the call through cuDNN on the compute stream and return true; or
// return false with the reason in *why when cuDNN cannot take it (float32,
// a head dim or layout its engines refuse, a graph no engine builds, an
// execution that failed), in which case the caller runs the engine's
// kernels, which overwrite every output. Arguments are already checked.
// Plans are built once per shape and layout and cached for the process.
bool cudnn_forward(const FwdArgs &a, std::string *why);
bool cudnn_backward(const BwdArgs &a, std::string *why);

// Checks the forward and backward graphs of one shape against cuDNN for an
// H200 without a GPU (cuDNN 9.8+'s device properties), with q, k, v as
// views into a fused [B, T, 3, H, D] buffer as GPT-2 has them: which
// engines support each graph (with hk > 0: hk key/value heads, grouped-query
// attention on views into a fused [B, T, H + 2 hk, D] buffer), and whether a
// plan could be built here (with
// no GPU, loading the compiled kernel fails: that part proves nothing).
// Throws when no engine supports a graph. A check of the graphs on a build
// machine, saying nothing of speed or numerics.
std::string cudnn_deviceless_check(const Dims &d, Dt dt, int64_t hk = 0);

}  // namespace tessera::cuda::attn
