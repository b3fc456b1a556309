// Causal scaled-dot-product attention as cuDNN graphs (see
// attention_cudnn.hpp). cuDNN 9 has no single "attention" operation before
// 9.21; its fused flash-attention engines are picked by matching a graph of
// primitive operations, so the graphs below are written node for node as
// cuDNN's own frontend (github.com/NVIDIA/cudnn-frontend, 1.2x, the
// "composite" SDPA nodes) lowers sdpa / sdpa_backward with a top-left causal
// mask, attention scale by value and fp32 statistics: a graph that differs
// (other dtypes for intermediates, other operation order) may match no
// engine at all.
//
// cuDNN's layout is [b, h, s, d] with arbitrary strides, so our [B, T, H, D]
// views go in as they are (strides permuted), fused qkv buffers included;
// K (and V in backward) enter transposed, [b, h, d, s], by swapping strides.
// Grouped-query attention (hk < H key/value heads) enters as the frontend
// writes it: K and V with hk heads, which the matmuls broadcast over each
// group of H / hk query heads, and dK, dV summed over the group by a
// reduction from fp32 full-head intermediates.
#include "backend/cuda/attention_cudnn.hpp"

#if TESSERA_HAVE_CUDNN

#include <compare>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include "backend/cuda/cudnn_graph.hpp"
#include "backend/cuda/device.hpp"

namespace tessera::cuda::attn {

namespace {

using cudnn::Dims4;
using cudnn::Graph;
using cudnn::Lib;

// Uids of the tensors the variant pack binds.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kOne,
  kSoftmaxSum,  // backward: rowsum(dO * O), fp32, in the workspace
  kDqAccum,     // backward: dq in fp32, in the workspace
  kDO,
  kDQ,
  kDK,
  kDV,
};

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

cudnnDataType_t io_type(Dt dt) {
  return dt == Dt::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// A [B, T, H, D] view as cuDNN's [b, h, s, d]: its strides, permuted.
Dims4 bhsd(const Bthd &v) {
  return {v.sb, v.sh, v.st, v.sd};
}
// The same view transposed, [b, h, d, s].
Dims4 bhds(const Bthd &v) {
  return {v.sb, v.sh, v.sd, v.st};
}

// Masked scores: -inf from 9.10 on, the lowest finite float before (the
// value cuDNN's frontend uses for each version).
float mask_value(const Lib &l) {
  return l.version >= 91000 ? -std::numeric_limits<float>::infinity()
                            : std::numeric_limits<float>::lowest();
}

// Top-left causal mask: s where row >= col, the mask value elsewhere (the
// frontend's diagonal-band mask with right bound 0).
int64_t causal_mask(Graph &g, int64_t s) {
  const int64_t row = g.virt_like(s, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, kF32, s, 0, 0, row, 2);
  const int64_t col = g.virt_like(s, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, kF32, s, 0, 0, col, 3);
  const int64_t keep = g.virt_like(s, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, 0, keep);
  const int64_t out = g.virt_like(s, kF32);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, kF32, s, kNegInf, keep, out);
  return out;
}

// y = op(x[, b]) into a new fp32 intermediate shaped like `like`.
int64_t pw(Graph &g, cudnnPointwiseMode_t op, int64_t x, int64_t b, int64_t like) {
  const int64_t y = g.virt_like(like, kF32);
  g.pointwise(op, kF32, x, b, 0, y);
  return y;
}

std::unique_ptr<Graph> forward_graph(const Lib &l, const FwdArgs &a) {
  auto g = std::make_unique<Graph>(l);
  const int64_t B = a.d.B, H = a.d.H, T = a.d.T, D = a.d.D, Hk = a.hk ? a.hk : H;
  const cudnnDataType_t io = io_type(a.dt);
  const Dims4 bhtd{B, H, T, D};
  g->tensor(kQ, io, bhtd, bhsd(a.q));
  g->tensor(kK, io, {B, Hk, D, T}, bhds(a.k));
  g->tensor(kV, io, {B, Hk, T, D}, bhsd(a.v));
  g->tensor(kO, io, bhtd, bhsd(a.o));
  g->tensor(kStats, kF32, {B, H, T, 1}, {H * T, T, 1, 1});
  g->scalar(kScale, kF32);
  g->scalar(kNegInf, kF32);

  const Dims4 sd{B, H, T, T}, ss{H * T * T, T * T, T, 1};  // scores
  const Dims4 rd{B, H, T, 1}, rs{H * T, T, 1, 1};          // per-row values
  const int64_t s = g->virt(kF32, sd, ss);
  g->matmul(kQ, kK, s);
  const int64_t scaled = pw(*g, CUDNN_POINTWISE_MUL, s, kScale, s);
  const int64_t masked = causal_mask(*g, scaled);
  // Softmax with its statistics: max, exp(s - max), sum, stats = max + ln sum.
  const int64_t mx = g->virt(kF32, rd, rs);
  g->reduction(CUDNN_REDUCE_TENSOR_MAX, masked, mx);
  const int64_t shifted = pw(*g, CUDNN_POINTWISE_SUB, masked, mx, s);
  const int64_t e = pw(*g, CUDNN_POINTWISE_EXP, shifted, 0, s);
  const int64_t sum = g->virt(kF32, rd, rs);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const int64_t log_sum = pw(*g, CUDNN_POINTWISE_LOG, sum, 0, sum);
  g->pointwise(CUDNN_POINTWISE_ADD, kF32, mx, log_sum, 0, kStats);
  // P in the input dtype (the second matmul's operand type), then O = P V.
  const int64_t p = g->virt(io, sd, ss);
  g->pointwise(CUDNN_POINTWISE_DIV, kF32, e, sum, 0, p);
  g->matmul(p, kV, kO);
  return g;
}

std::unique_ptr<Graph> backward_graph(const Lib &l, const BwdArgs &a) {
  auto g = std::make_unique<Graph>(l);
  const int64_t B = a.d.B, H = a.d.H, T = a.d.T, D = a.d.D, Hk = a.hk ? a.hk : H;
  const cudnnDataType_t io = io_type(a.dt);
  const Dims4 bhtd{B, H, T, D}, kv{B, Hk, T, D};
  g->tensor(kQ, io, bhtd, bhsd(a.q));
  g->tensor(kK, io, {B, Hk, D, T}, bhds(a.k));
  g->tensor(kV, io, {B, Hk, D, T}, bhds(a.v));
  g->tensor(kO, io, bhtd, bhsd(a.o));
  g->tensor(kDO, io, bhtd, bhsd(a.dout));
  g->tensor(kStats, kF32, {B, H, T, 1}, {H * T, T, 1, 1});
  g->tensor(kDQ, io, bhtd, bhsd(a.dq));
  g->tensor(kDK, io, kv, bhsd(a.dk));
  g->tensor(kDV, io, kv, bhsd(a.dv));
  g->scalar(kScale, kF32);
  g->scalar(kNegInf, kF32);
  g->scalar(kOne, kF32);
  const Dims4 rd{B, H, T, 1}, rs{H * T, T, 1, 1};
  g->tensor(kSoftmaxSum, kF32, rd, rs);
  g->tensor(kDqAccum, kF32, bhtd, {H * T * D, T * D, D, 1});

  // softmax_sum = rowsum(dO * O) (times 1: the frontend's dropout-scale slot).
  const int64_t dOO = g->virt(kF32, bhtd, {H * T * D, T * D, H * D, 1});
  g->pointwise(CUDNN_POINTWISE_MUL, kF32, kDO, kO, 0, dOO);
  const int64_t row_sum = g->virt(kF32, rd, rs);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, dOO, row_sum);
  g->pointwise(CUDNN_POINTWISE_MUL, kF32, row_sum, kOne, 0, kSoftmaxSum);

  // P = exp(scale * Q K^T - stats), causal.
  const Dims4 sd{B, H, T, T}, ss{H * T * T, T * T, T, 1}, st{H * T * T, T * T, 1, T};
  const int64_t s = g->virt(kF32, sd, ss);
  g->matmul(kQ, kK, s);
  const int64_t scaled = pw(*g, CUDNN_POINTWISE_MUL, s, kScale, s);
  const int64_t centred = pw(*g, CUDNN_POINTWISE_SUB, scaled, kStats, s);
  const int64_t masked = causal_mask(*g, centred);
  const int64_t p = pw(*g, CUDNN_POINTWISE_EXP, masked, 0, s);

  // dV = P^T dO (with groups: per query head in fp32, then summed).
  const Dims4 full_strides{H * T * D, T * D, D, 1};
  const auto grad_kv = [&](int64_t lhs, int64_t rhs, int64_t out) {
    if (Hk == H) {
      g->matmul(lhs, rhs, out);
      return;
    }
    const int64_t full = g->virt(kF32, bhtd, full_strides);
    g->matmul(lhs, rhs, full);
    g->reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };
  const int64_t pt = g->virt(io, sd, st);
  g->reshape(p, pt);
  grad_kv(pt, kDO, kDV);

  // dS = P * (dO V^T - softmax_sum) * scale.
  const int64_t dp = g->virt(kF32, sd, ss);
  g->matmul(kDO, kV, dp);
  const int64_t dp_c = pw(*g, CUDNN_POINTWISE_SUB, dp, kSoftmaxSum, s);
  const int64_t ds_u = pw(*g, CUDNN_POINTWISE_MUL, dp_c, p, s);
  const int64_t ds = pw(*g, CUDNN_POINTWISE_MUL, ds_u, kScale, s);

  // dK = dS^T Q.
  const int64_t dst = g->virt(io, sd, st);
  g->reshape(ds, dst);
  grad_kv(dst, kQ, kDK);

  // dQ = dS K, accumulated in fp32, then cast.
  const int64_t k = g->virt(kF32, kv, bhsd(a.k));
  g->reshape(kK, k);
  g->matmul(ds, k, kDqAccum);
  g->pointwise(CUDNN_POINTWISE_IDENTITY, kF32, kDqAccum, 0, 0, kDQ);
  return g;
}

// Why cuDNN cannot take a call of this shape and layout ("" when it can).
// The flash-attention engines need bf16/fp16, a head dim that is a multiple
// of 8, and 16-byte aligned operands with unit stride along D.
std::string refusal(const Lib &l, const Dims &d, Dt dt, std::initializer_list<Bthd> views,
                    bool backward) {
  if (dt == Dt::F32) return "float32 (cuDNN's flash attention takes bf16 and fp16)";
  if (d.D % 8 != 0) return "head dim " + std::to_string(d.D) + " is not a multiple of 8";
  if (d.T < 2) return "T = 1";
  for (const Bthd &v : views)
    if (!vec16(v, d.D)) return "an operand is not 16-byte aligned with unit stride along D";
  // cuDNN's frontend refuses these versions for bugs in SDPA, and before
  // 9.15.1 wraps backward graphs with T % 128 != 0 in a padding mask that
  // works around a cuDNN bug; we do not build that variant.
  if (l.version == 91000 || l.version == 91001)
    return "cuDNN 9.10.0 and 9.10.1 have known SDPA bugs";
  if (backward && l.version <= 91500 && d.T % 128 != 0)
    return "backward with T % 128 != 0 needs cuDNN 9.15.1 or newer";
  return "";
}

// One cached plan: per direction, shape, dtype, strides and device.
struct Key {
  bool backward;
  int dt;
  int device;
  int64_t B, T, H, D, Hk;
  std::array<int64_t, 24> strides{};  // (sb, st, sh) of up to 8 views
  auto operator<=>(const Key &) const = default;
};

Key make_key(bool backward, const Dims &d, Dt dt, int64_t hk, std::initializer_list<Bthd> views) {
  Key k{backward, static_cast<int>(dt), current_device(), d.B, d.T, d.H, d.D, hk ? hk : d.H};
  size_t i = 0;
  for (const Bthd &v : views) {
    k.strides[i++] = v.sb, k.strides[i++] = v.st, k.strides[i++] = v.sh;
  }
  return k;
}

struct Entry {
  cudnn::Plan plan;  // plan.plan NULL: declined, for `why`
  std::string why;
};

struct Cache {
  std::mutex mu;
  std::map<Key, Entry> entries;
};

Cache &cache() {
  static Cache *c = new Cache;  // never destroyed (cuDNN may be gone at exit)
  return *c;
}

// The entry for `key`, built on first sight: graph, plan (or the reason
// there is none). Caller holds the cache lock.
template <typename MakeGraph>
Entry &entry(const Lib &l, const Key &key, MakeGraph make_graph) {
  Cache &c = cache();
  auto it = c.entries.find(key);
  if (it != c.entries.end()) return it->second;
  Entry e;
  try {
    cudnnHandle_t h = cudnn::handle(l);
    std::unique_ptr<Graph> g = make_graph();
    g->finalize(h);
    e.plan = cudnn::build_plan(l, std::move(g), h, nullptr);
  } catch (const Error &err) {
    e.why = err.what();
  }
  return c.entries.emplace(key, std::move(e)).first->second;
}

// Device memory for one execution from the caching allocator, given back
// when the call has been enqueued: the allocator reuses blocks in compute
// stream order, so the next user runs after this call's kernels.
struct Workspace {
  void *p = nullptr;
  explicit Workspace(size_t bytes) : p(bytes ? device_alloc(bytes) : nullptr) {}
  ~Workspace() {
    if (p) device_free(p);
  }
  Workspace(const Workspace &) = delete;
  Workspace &operator=(const Workspace &) = delete;
};

constexpr size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

}  // namespace

bool cudnn_available(std::string *what) {
  std::string why;
  const Lib *l = cudnn::lib(&why);
  if (!l) {
    *what = why;
    return false;
  }
  *what = "cuDNN " + cudnn::version_string(l->version) + " (" + l->path + ")";
  return true;
}

bool cudnn_forward(const FwdArgs &a, std::string *why) {
  const Lib *l = cudnn::lib(why);
  if (!l) return false;
  *why = refusal(*l, a.d, a.dt, {a.q, a.k, a.v, a.o}, false);
  if (!why->empty()) return false;
  std::lock_guard<std::mutex> lock(cache().mu);
  Entry &e = entry(*l, make_key(false, a.d, a.dt, a.hk, {a.q, a.k, a.v, a.o}),
                   [&] { return forward_graph(*l, a); });
  if (!e.plan.plan) {
    *why = e.why;
    return false;
  }
  float scale = a.scale, neg = mask_value(*l);
  Workspace ws(static_cast<size_t>(e.plan.workspace));
  try {
    cudnn::execute(*l, cudnn::handle(*l), e.plan, {kQ, kK, kV, kO, kStats, kScale, kNegInf},
                   {a.q.p, a.k.p, a.v.p, a.o.p, a.lse, &scale, &neg}, ws.p);
  } catch (const Error &err) {
    e.why = std::string("execution failed: ") + err.what();
    e.plan.plan.reset();  // do not try this plan again
    *why = e.why;
    return false;
  }
  return true;
}

bool cudnn_backward(const BwdArgs &a, std::string *why) {
  const Lib *l = cudnn::lib(why);
  if (!l) return false;
  *why = refusal(*l, a.d, a.dt, {a.q, a.k, a.v, a.o, a.dout, a.dq, a.dk, a.dv}, true);
  if (!why->empty()) return false;
  std::lock_guard<std::mutex> lock(cache().mu);
  Entry &e =
      entry(*l, make_key(true, a.d, a.dt, a.hk, {a.q, a.k, a.v, a.o, a.dout, a.dq, a.dk, a.dv}),
            [&] { return backward_graph(*l, a); });
  if (!e.plan.plan) {
    *why = e.why;
    return false;
  }
  // Workspace: dq's fp32 accumulator, softmax_sum, then cuDNN's own (the
  // frontend's layout).
  const size_t rows = static_cast<size_t>(a.d.B * a.d.H * a.d.T);
  const size_t acc_bytes = align256(rows * static_cast<size_t>(a.d.D) * 4);
  const size_t sum_bytes = align256(rows * 4);
  Workspace ws(acc_bytes + sum_bytes + static_cast<size_t>(e.plan.workspace));
  char *base = static_cast<char *>(ws.p);
  // Before 9.6 the accumulator had to arrive zeroed; later cuDNN clears it.
  if (l->version < 90600)
    TSR_CUDA_CHECK(
        cudaMemsetAsync(base, 0, rows * static_cast<size_t>(a.d.D) * 4, compute_stream()));
  float scale = a.scale, neg = mask_value(*l), one = 1.0f;
  void *cudnn_ws = e.plan.workspace ? base + acc_bytes + sum_bytes : nullptr;
  try {
    cudnn::execute(
        *l, cudnn::handle(*l), e.plan,
        {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kNegInf, kOne, kSoftmaxSum, kDqAccum},
        {a.q.p, a.k.p, a.v.p, a.o.p, a.dout.p, const_cast<float *>(a.lse), a.dq.p, a.dk.p, a.dv.p,
         &scale, &neg, &one, base + acc_bytes, base},
        cudnn_ws);
  } catch (const Error &err) {
    e.why = std::string("execution failed: ") + err.what();
    e.plan.plan.reset();
    *why = e.why;
    return false;
  }
  return true;
}

std::string cudnn_deviceless_check(const Dims &d, Dt dt, int64_t hk) {
  std::string why;
  const Lib *l = cudnn::lib(&why);
  TSR_CHECK(l, TSR_ERR_UNSUPPORTED, why);
  const cudnn::Desc props = cudnn::h200_properties(*l);
  // Views into a fused [B, T, H + 2 hk, D] qkv buffer and its gradient (GPT-2's
  // [B, T, 3, H, D] when hk = H), at a made-up 256-byte aligned address (only
  // the layout matters here).
  if (hk == 0) hk = d.H;
  char *base = reinterpret_cast<char *>(uintptr_t{1} << 20);
  const int64_t esz = 2, st = (d.H + 2 * hk) * d.D, sb = d.T * st;
  const int64_t offset[3] = {0, d.H * d.D, (d.H + hk) * d.D};
  auto fused = [&](int which) { return Bthd{base + offset[which] * esz, sb, st, d.D, 1}; };
  const Bthd compact{base, d.T * d.H * d.D, d.H * d.D, d.D, 1};
  std::string out;
  auto build = [&](const char *name, std::unique_ptr<Graph> g) {
    g->finalize(nullptr);
    std::string engines;
    for (int64_t id : cudnn::supported_engines(*l, *g, &props))
      engines += (engines.empty() ? "" : ", ") + std::to_string(id);
    TSR_CHECK(!engines.empty(), TSR_ERR_UNSUPPORTED,
              std::string("no cuDNN engine supports the ") + name + " graph");
    out += std::string(name) + ": engines " + engines + " support the graph; ";
    // Compiling the first config shows that cuDNN can generate its kernel;
    // without a GPU (or with the driver's stub) loading it then fails.
    try {
      const cudnn::Plan p = cudnn::build_plan(*l, std::move(g), nullptr, &props, 1);
      out += "plan built (engine " + std::to_string(p.engine) + ", workspace " +
             std::to_string(p.workspace) + " B)\n";
    } catch (const Error &e) {
      out += std::string("no plan here: ") + e.what() + "\n";
    }
  };
  const FwdArgs f{d, dt, fused(0), fused(1), fused(2), compact, nullptr, 0.125f, hk};
  TSR_CHECK(refusal(*l, d, dt, {f.q, f.k, f.v, f.o}, false).empty(), TSR_ERR_UNSUPPORTED,
            "cuDNN declines the forward: " + refusal(*l, d, dt, {f.q, f.k, f.v, f.o}, false));
  build("forward", forward_graph(*l, f));
  const BwdArgs b{d,        dt,       fused(0), fused(1), fused(2), compact, compact,
                  fused(0), fused(1), fused(2), nullptr,  0.125f,   hk};
  const std::string rb = refusal(*l, d, dt, {b.q, b.k, b.v, b.o, b.dout}, true);
  TSR_CHECK(rb.empty(), TSR_ERR_UNSUPPORTED, "cuDNN declines the backward: " + rb);
  build("backward", backward_graph(*l, b));
  return out;
}

}  // namespace tessera::cuda::attn

#else  // !TESSERA_HAVE_CUDNN

namespace tessera::cuda::attn {

namespace {
constexpr const char *kNotBuilt =
    "this build has no cuDNN support (cudnn_graph.h was not found at configure time; "
    "see docs/gpu.md)";
}

bool cudnn_available(std::string *what) {
  *what = kNotBuilt;
  return false;
}
bool cudnn_forward(const FwdArgs &, std::string *why) {
  *why = kNotBuilt;
  return false;
}
bool cudnn_backward(const BwdArgs &, std::string *why) {
  *why = kNotBuilt;
  return false;
}
std::string cudnn_deviceless_check(const Dims &, Dt, int64_t) {
  throw Error(TSR_ERR_UNSUPPORTED, kNotBuilt);
}

}  // namespace tessera::cuda::attn

#endif  // TESSERA_HAVE_CUDNN
