// CUDA ops: matmul and linear on cuBLASLt.
//
// Our tensors are row-major, cuBLASLt's are column-major. A row-major m x n
// matrix is the column-major n x m matrix of the same bytes, so
//   C = op(A) op(B)   (row-major)  is  C^T = op(B)^T op(A)^T  (column-major)
// and we hand cuBLASLt our b as its "A" and our a as its "B", each with its
// own transpose flag, and our c as an n x m column-major D with ld n. The
// epilogue bias of cuBLASLt runs along D's rows, which are our columns: just
// what bias[n] needs.
//
// Every call takes fp32 accumulation (CUBLAS_COMPUTE_32F, no TF32: fp32 runs
// must agree with the CPU to 1e-5). Descriptors, layouts and the heuristic's
// algorithm are cached per problem (shapes, dtypes, transposes, epilogue,
// pointer alignment), so a training step queries the heuristic only once per
// distinct matmul. One handle and one 32 MiB workspace serve the process.
// gemm.hpp shares the checked problem and run_gemm with the backward
// epilogues of ops_matmul_grad.cpp.
#include <cublasLt.h>

#include <atomic>
#include <compare>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/gemm.hpp"
#include "backend/cuda/gemm_tune.hpp"

namespace tessera::cuda {
namespace {

#define TSR_CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)
void check_cublas(cublasStatus_t s, const char *call, const char *file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw Error(s == CUBLAS_STATUS_ALLOC_FAILED ? TSR_ERR_NO_MEMORY : TSR_ERR_INTERNAL,
              std::string(call) + " failed: " + cublasLtGetStatusName(s) + " (" +
                  cublasLtGetStatusString(s) + ") at " + file + ":" + std::to_string(line));
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    default:
      throw Error(TSR_ERR_INTERNAL, "matmul: no cuBLAS type for int32");
  }
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// The alignment cuBLASLt may assume for a pointer: its lowest set bit,
// capped at the 256 bytes the heuristic assumes by default.
uint32_t alignment(const void *p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (v == 0) return 256;
  const uintptr_t low = v & (~v + 1);
  return static_cast<uint32_t>(low < 256 ? low : 256);
}

// One matmul problem: everything the descriptors and the algorithm depend on.
struct Key {
  int64_t m, n, k;
  int32_t ta, tb;
  DType ab, c;
  uint32_t epilogue;
  int64_t aux_ld;
  uint32_t align_a, align_b, align_c, align_bias, align_aux;
  auto operator<=>(const Key &) const = default;
};

struct Plan {
  bool ok = false;  // false: the heuristic found no algorithm
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // The heuristic's other candidates, best-ranked first, until the first
  // call times them (gemm_tune.cpp) and keeps the fastest in algo.
  std::vector<cublasLtMatmulAlgo_t> candidates;
};

struct State {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  void *workspace = nullptr;
  std::map<Key, Plan> plans;
};

// Problems whose fused epilogue cuBLASLt had no algorithm for (each call
// then took a plainer path): the GPU tests read it to see that the fused
// paths really run for GPT-2's shapes.
std::atomic<uint64_t> g_epilogue_misses{0};

// Never destroyed: the handle and the plans live as long as the process
// (destroying them at exit could run after the CUDA context is gone).
State &state() {
  static State *s = new State;
  return *s;
}

// "m x k @ k x n bf16 -> f32, epilogue E" for the tuning log.
std::string describe_problem(const Key &k) {
  return std::to_string(k.m) + "x" + std::to_string(k.k) + (k.ta ? "^T" : "") + " @ " +
         std::to_string(k.k) + "x" + std::to_string(k.n) + (k.tb ? "^T" : "") + " " +
         dtype_name(k.ab) + " -> " + dtype_name(k.c) + ", epilogue " + std::to_string(k.epilogue);
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T &v) {
  TSR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

Plan make_plan(State &st, const Key &key, const void *bias, void *aux) {
  Plan p;
  const cublasOperation_t op_a = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS "A" = our b
  const cublasOperation_t op_b = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS "B" = our a
  TSR_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<cublasLtEpilogue_t>(key.epilogue));
  if (bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (aux) {
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, key.aux_ld);
  }
  // Column-major views of our row-major buffers (see the top of the file):
  // b is k x n (or n x k transposed), a is m x k (or k x m), c is m x n.
  const uint64_t b_rows = key.tb ? key.k : key.n, b_cols = key.tb ? key.n : key.k;
  const uint64_t a_rows = key.ta ? key.m : key.k, a_cols = key.ta ? key.k : key.m;
  TSR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, cuda_type(key.ab), b_rows, b_cols,
                                              static_cast<int64_t>(b_rows)));
  TSR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, cuda_type(key.ab), a_rows, a_cols,
                                              static_cast<int64_t>(a_rows)));
  TSR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, cuda_type(key.c), key.n, key.m, key.n));

  cublasLtMatmulPreference_t pref = nullptr;
  TSR_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto v) {
    TSR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  const int want = gemm_tuning() ? kTuneCandidates : 1;
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(st.handle, p.desc, p.la, p.lb, p.lc, p.lc,
                                                          pref, want, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // NOT_SUPPORTED (or no result) means "no algorithm for this combination":
  // the caller falls back to a plainer epilogue. Other failures are errors.
  if (s != CUBLAS_STATUS_NOT_SUPPORTED) TSR_CUBLAS_CHECK(s);
  if (s != CUBLAS_STATUS_SUCCESS) return p;
  for (int i = 0; i < found; i++)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p.candidates.push_back(results[i].algo);
  p.ok = !p.candidates.empty();
  if (p.ok) p.algo = p.candidates.front();
  if (p.candidates.size() < 2) p.candidates.clear();  // nothing to choose between
  return p;
}

}  // namespace

bool overlaps(const View &x, const View &y) {
  if (x.numel() == 0 || y.numel() == 0) return false;
  const auto x0 = reinterpret_cast<uintptr_t>(x.p), y0 = reinterpret_cast<uintptr_t>(y.p);
  return x0 < y0 + y.bytes() && y0 < x0 + x.bytes();
}

Gemm check_gemm(const char *op, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                int32_t trans_b, const DLTensor *c) {
  Gemm g{floating(op, "a", a, 1),
         floating(op, "b", b, 2),
         floating(op, "c", c, 1),
         trans_a,
         trans_b,
         0,
         0,
         0};
  TSR_CHECK(b->ndim == 2, TSR_ERR_INVALID, std::string(op) + ": b must be 2-D, got " + describe(b));
  TSR_CHECK((trans_a == 0 || trans_a == 1) && (trans_b == 0 || trans_b == 1), TSR_ERR_INVALID,
            std::string(op) + ": trans flags must be 0 or 1, got trans_a=" +
                std::to_string(trans_a) + " trans_b=" + std::to_string(trans_b));
  const std::string shapes = " (a " + describe(a) + " trans_a=" + std::to_string(trans_a) + ", b " +
                             describe(b) + " trans_b=" + std::to_string(trans_b) + ", c " +
                             describe(c) + ")";
  check_same_dtype(op, "a", a, g.a, "b", b, g.b);
  TSR_CHECK(g.c.dt == g.a.dt || g.c.dt == DType::F32, TSR_ERR_UNSUPPORTED,
            std::string(op) + ": c must have the dtype of a and b, or float32" + shapes);
  g.m = trans_a ? g.a.cols : g.a.rows;
  g.k = trans_a ? g.a.rows : g.a.cols;
  const int64_t kb = trans_b ? g.b.cols : g.b.rows;
  g.n = trans_b ? g.b.rows : g.b.cols;
  TSR_CHECK(g.k == kb, TSR_ERR_INVALID,
            std::string(op) + ": inner dimensions differ: op(a) is " + std::to_string(g.m) + "x" +
                std::to_string(g.k) + ", op(b) is " + std::to_string(kb) + "x" +
                std::to_string(g.n) + shapes);
  TSR_CHECK(g.c.rows == g.m && g.c.cols == g.n, TSR_ERR_INVALID,
            std::string(op) + ": c must be " + std::to_string(g.m) + "x" + std::to_string(g.n) +
                " viewed as (rows, last dim), got " + std::to_string(g.c.rows) + "x" +
                std::to_string(g.c.cols) + shapes);
  TSR_CHECK(!overlaps(g.c, g.a) && !overlaps(g.c, g.b), TSR_ERR_INVALID,
            std::string(op) + ": c overlaps a or b in memory" + shapes);
  return g;
}

bool run_gemm(const Gemm &g, void *d, float alpha, float beta, cublasLtEpilogue_t epilogue,
              const void *bias, void *aux, int64_t aux_ld) {
  State &st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.handle) {
    TSR_CUBLAS_CHECK(cublasLtCreate(&st.handle));
    st.workspace = device_alloc(kWorkspaceBytes);
  }
  const Key key{g.m,
                g.n,
                g.k,
                g.ta,
                g.tb,
                g.a.dt,
                g.c.dt,
                static_cast<uint32_t>(epilogue),
                aux_ld,
                alignment(g.a.p),
                alignment(g.b.p),
                alignment(d),
                alignment(bias),
                alignment(aux)};
  auto it = st.plans.find(key);
  if (it == st.plans.end()) {
    it = st.plans.emplace(key, make_plan(st, key, bias, aux)).first;
    if (!it->second.ok && epilogue != CUBLASLT_EPILOGUE_DEFAULT) g_epilogue_misses.fetch_add(1);
  }
  Plan &p = it->second;
  if (!p.ok) return false;
  // The pointers change from call to call; the descriptor keeps the rest.
  if (bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (aux) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  if (!p.candidates.empty()) {
    const TuneCall call{st.handle,    p.desc,          p.la,       p.lb,  p.lc,
                        g.b.p,        g.a.p,           d,          alpha, beta,
                        st.workspace, kWorkspaceBytes, g.c.bytes()};  // d has c's shape and dtype
    p.algo = tune_gemm(call, p.candidates, describe_problem(key));
    p.candidates.clear();
  }
  TSR_CUBLAS_CHECK(cublasLtMatmul(st.handle, p.desc, &alpha, g.b.p, p.la, g.a.p, p.lb, &beta, d,
                                  p.lc, d, p.lc, &p.algo, st.workspace, kWorkspaceBytes,
                                  compute_stream()));
  return true;
}

void plain_gemm(const char *op, const Gemm &g, const View &d, float alpha, float beta) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    if (beta == 0.0f) {
      // BLAS semantics: d is not read. Zero bits are 0.0 in every float type.
      TSR_CUDA_CHECK(cudaMemsetAsync(d.p, 0, d.bytes(), compute_stream()));
    } else {
      launch_scale(d, beta);
    }
    return;
  }
  TSR_CHECK(run_gemm(g, d.p, alpha, beta, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0),
            TSR_ERR_UNSUPPORTED,
            std::string(op) + ": cuBLASLt has no algorithm for " + std::to_string(g.m) + "x" +
                std::to_string(g.k) + " @ " + std::to_string(g.k) + "x" + std::to_string(g.n) +
                " in " + dtype_name(g.a.dt) + " -> " + dtype_name(g.c.dt));
}

uint64_t epilogue_misses() {
  return g_epilogue_misses.load();
}

tsr_status matmul(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                  int32_t trans_b, DLTensor *c, float alpha, float beta) noexcept {
  return guarded(ctx, [&] {
    if (side_of("matmul", {{"a", a}, {"b", b}, {"c", c}}) == Side::Host) {
      AsCpu ha(a), hb(b), hc(c);
      host_result(cpu_ops()->matmul(ctx, ha.p, trans_a, hb.p, trans_b, hc.mut(), alpha, beta));
      return;
    }
    const Gemm g = check_gemm("matmul", a, trans_a, b, trans_b, c);
    plain_gemm("matmul", g, g.c, alpha, beta);
  });
}

tsr_status linear(tsr_host_ctx *ctx, const DLTensor *a, int32_t trans_a, const DLTensor *b,
                  int32_t trans_b, const DLTensor *bias, tsr_activation act, DLTensor *c,
                  DLTensor *pre) noexcept {
  return guarded(ctx, [&] {
    if (side_of("linear", {{"a", a}, {"b", b}, {"bias", bias}, {"c", c}, {"pre", pre}}) ==
        Side::Host) {
      AsCpu ha(a), hb(b), hbias(bias), hc(c), hpre(pre);
      host_result(need_cpu(cpu_ops()->linear, "linear")(ctx, ha.p, trans_a, hb.p, trans_b, hbias.p,
                                                        act, hc.mut(), hpre.mut()));
      return;
    }
    const Gemm g = check_gemm("linear", a, trans_a, b, trans_b, c);
    check_activation("linear", act);
    View vbias{}, vpre{};
    if (bias) {
      vbias = floating("linear", "bias", bias, 1);
      TSR_CHECK(vbias.numel() == g.n, TSR_ERR_INVALID,
                "linear: bias " + describe(bias) + " must have " + std::to_string(g.n) +
                    " elements, the last dim of c " + describe(c));
    }
    if (pre) {
      vpre = floating("linear", "pre", pre, 1);
      TSR_CHECK(vpre.rows == g.c.rows && vpre.cols == g.c.cols && vpre.dt == g.c.dt,
                TSR_ERR_INVALID, "linear: pre " + describe(pre) + " must match c " + describe(c));
      TSR_CHECK(!overlaps(vpre, g.a) && !overlaps(vpre, g.b) && !overlaps(vpre, g.c),
                TSR_ERR_INVALID, "linear: pre overlaps a, b or c in memory");
    }
    if (g.m == 0 || g.n == 0) return;

    // cuBLASLt's bias must have D's dtype; another bias dtype takes the
    // unfused path below.
    const bool bias_fusable = !bias || vbias.dt == g.c.dt;
    const void *bp = bias ? vbias.p : nullptr;
    if (g.k > 0 && bias_fusable) {
      if (!pre) {
        // The whole layer in one cuBLASLt call where an epilogue exists.
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
        bool fused = true;
        switch (act) {
          case TSR_ACT_NONE:
            epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
            break;
          case TSR_ACT_RELU:
            epi = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
            break;
          case TSR_ACT_GELU:
            epi = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
            break;
          default:
            fused = false;  // tanh has no epilogue
        }
        if (fused && run_gemm(g, g.c.p, 1.0f, 0.0f, epi, bp, nullptr, 0)) return;
      } else {
        // GELU_AUX writes the pre-activation as a column-major n x m matrix
        // with ld aux_ld: with aux_ld = n that is exactly our row-major pre
        // [m, n]. cuBLASLt wants the ld divisible by 8.
        if (act == TSR_ACT_GELU && g.n % 8 == 0) {
          const cublasLtEpilogue_t epi =
              bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
          if (run_gemm(g, g.c.p, 1.0f, 0.0f, epi, bp, vpre.p, g.n)) return;
        }
        // Bias fused into the matmul that writes pre, then the activation
        // as one element-wise pass pre -> c.
        if (run_gemm(g, vpre.p, 1.0f, 0.0f,
                     bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bp, nullptr, 0)) {
          launch_act_forward(act, vpre, g.c);
          return;
        }
      }
    }
    // Unfused: plain matmul into pre (or c), bias + activation kernels.
    const View &d = pre ? vpre : g.c;
    plain_gemm("linear", g, d, 1.0f, 0.0f);
    launch_bias_act(d, bias ? &vbias : nullptr, pre ? TSR_ACT_NONE : act);
    if (pre) launch_act_forward(act, vpre, g.c);
  });
}

}  // namespace tessera::cuda
