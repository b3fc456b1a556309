// CUDA ops: layernorm forward and backward over the last dim, and the
// forward with the residual add before it (ABI 1.3's add_layernorm_forward),
// for float32, bfloat16 and float16 tensors (weight and bias in any of the
// three) with float32 arithmetic inside. Semantics follow the CPU ops
// (backend/cpu/cpu_ops_layernorm.cpp).
//
// Deterministic: the row statistics are warp sums in a fixed order, and
// dweight / dbias are partial column sums over fixed partitions, added up in
// a fixed order by a second pass (col_sums.cuh). The backward of rows in
// 8-element packs is one pass over dy, x and dx
// (layernorm_backward_rows.cuh); other rows take three.
#include <tuple>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/col_sums.cuh"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/layernorm_backward_rows.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// True when the two views share any byte.
bool overlaps_bytes(const View &a, const View &b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.p), b0 = reinterpret_cast<uintptr_t>(b.p);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

// ---------------------------------------------------------------------------
// Layernorm, llm.c style: one warp per row. Forward reads the row three
// times (mean, variance, output), the later passes from cache.

constexpr int kRowsPerBlock = kThreads / 32;

// kAdd (add_layernorm_forward): the first pass reads x and the addend,
// stores their sum rounded to T in `sum_out` and adds up the stored values;
// the later passes read that row back (this thread's own writes, from
// cache). The statistics then come from the same values in the same order
// as a layernorm_forward of the stored sum: the two ops agree bit for bit.
template <typename T, typename W, bool kAdd>
__global__ void layernorm_forward_kernel(const T *x, const T *addend, T *sum_out, const W *weight,
                                         const W *bias, float eps, T *y, float *mean_out,
                                         float *rstd_out, int64_t rows, int64_t C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const T *xr = x + r * C;
  T *yr = y + r * C;
  const int64_t packs = vec ? C / kPack : 0;
  float sum = 0.0f;
  if constexpr (kAdd) {
    const T *ar = addend + r * C;
    T *sr = sum_out + r * C;
    for (int64_t p = lane; p < packs; p += 32) {
      float v[kPack], u[kPack];
      load8(xr + p * kPack, v);
      load8(ar + p * kPack, u);
#pragma unroll
      for (int j = 0; j < kPack; j++) v[j] = to_f(from_f<T>(v[j] + u[j]));
      store8(sr + p * kPack, v);
#pragma unroll
      for (int j = 0; j < kPack; j++) sum += v[j];
    }
    for (int64_t j = packs * kPack + lane; j < C; j += 32) {
      const T v = from_f<T>(to_f(xr[j]) + to_f(ar[j]));
      sr[j] = v;
      sum += to_f(v);
    }
    xr = sr;  // the later passes normalize the stored sum
  } else {
    for (int64_t p = lane; p < packs; p += 32) {
      float v[kPack];
      load8(xr + p * kPack, v);
#pragma unroll
      for (int j = 0; j < kPack; j++) sum += v[j];
    }
    for (int64_t j = packs * kPack + lane; j < C; j += 32) sum += to_f(xr[j]);
  }
  const float m = warp_sum(sum) / static_cast<float>(C);
  float var = 0.0f;
  for (int64_t p = lane; p < packs; p += 32) {
    float v[kPack];
    load8(xr + p * kPack, v);
#pragma unroll
    for (int j = 0; j < kPack; j++) var += (v[j] - m) * (v[j] - m);
  }
  for (int64_t j = packs * kPack + lane; j < C; j += 32) {
    const float dv = to_f(xr[j]) - m;
    var += dv * dv;
  }
  const float s = rsqrtf(warp_sum(var) / static_cast<float>(C) + eps);
  for (int64_t p = lane; p < packs; p += 32) {
    float v[kPack], w[kPack], b[kPack] = {};
    load8(xr + p * kPack, v);
    load8(weight + p * kPack, w);
    if (bias) load8(bias + p * kPack, b);
#pragma unroll
    for (int j = 0; j < kPack; j++) v[j] = (v[j] - m) * s * w[j] + b[j];
    store8(yr + p * kPack, v);
  }
  for (int64_t j = packs * kPack + lane; j < C; j += 32) {
    const float b = bias ? to_f(bias[j]) : 0.0f;
    yr[j] = from_f<T>((to_f(xr[j]) - m) * s * to_f(weight[j]) + b);
  }
  if (lane == 0) {
    mean_out[r] = m;
    rstd_out[r] = s;
  }
}

// dx += rstd * (dy w - mean(dy w) - norm * mean(dy w norm)), norm the
// normalized input. Pass 1 takes the two row means, pass 2 writes; dx may
// alias dy (each element read, then written, by one thread).
template <typename T, typename W>
__global__ void layernorm_dx_kernel(const T *dy, const T *x, const W *weight, const float *mean,
                                    const float *rstd, T *dx, int64_t rows, int64_t C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const T *dyr = dy + r * C, *xr = x + r * C;
  T *dxr = dx + r * C;
  const float m = mean[r], s = rstd[r];
  const int64_t packs = vec ? C / kPack : 0;
  float a = 0.0f, b = 0.0f;  // sums of dy w and dy w norm
  for (int64_t p = lane; p < packs; p += 32) {
    float d[kPack], v[kPack], w[kPack];
    load8(dyr + p * kPack, d);
    load8(xr + p * kPack, v);
    load8(weight + p * kPack, w);
#pragma unroll
    for (int j = 0; j < kPack; j++) {
      const float dn = d[j] * w[j];
      a += dn;
      b += dn * ((v[j] - m) * s);
    }
  }
  for (int64_t j = packs * kPack + lane; j < C; j += 32) {
    const float dn = to_f(dyr[j]) * to_f(weight[j]);
    a += dn;
    b += dn * ((to_f(xr[j]) - m) * s);
  }
  const float mean_a = warp_sum(a) / static_cast<float>(C);
  const float mean_b = warp_sum(b) / static_cast<float>(C);
  for (int64_t p = lane; p < packs; p += 32) {
    float d[kPack], v[kPack], w[kPack], o[kPack];
    load8(dyr + p * kPack, d);
    load8(xr + p * kPack, v);
    load8(weight + p * kPack, w);
    load8(dxr + p * kPack, o);
#pragma unroll
    for (int j = 0; j < kPack; j++) o[j] += s * (d[j] * w[j] - mean_a - ((v[j] - m) * s) * mean_b);
    store8(dxr + p * kPack, o);
  }
  for (int64_t j = packs * kPack + lane; j < C; j += 32) {
    const float dn = to_f(dyr[j]) * to_f(weight[j]);
    const float nv = (to_f(xr[j]) - m) * s;
    dxr[j] = from_f<T>(to_f(dxr[j]) + s * (dn - mean_a - nv * mean_b));
  }
}

}  // namespace

tsr_status layernorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *weight,
                             const DLTensor *bias, float eps, DLTensor *y, DLTensor *mean,
                             DLTensor *rstd) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "layernorm_forward";
    if (side_of(op, {{"x", x},
                     {"weight", weight},
                     {"bias", bias},
                     {"y", y},
                     {"mean", mean},
                     {"rstd", rstd}}) == Side::Host) {
      AsCpu hx(x), hw(weight), hb(bias), hy(y), hm(mean), hr(rstd);
      host_result(need_cpu(cpu_ops()->layernorm_forward, op)(ctx, hx.p, hw.p, hb.p, eps, hy.mut(),
                                                             hm.mut(), hr.mut()));
      return;
    }
    const View X = floating(op, "x", x, 1), W = floating(op, "weight", weight),
               Y = floating(op, "y", y, 1), M = f32(op, "mean", mean), R = f32(op, "rstd", rstd);
    View B{};
    if (bias) {
      B = floating(op, "bias", bias);
      check_same_dtype(op, "weight", weight, W, "bias", bias, B);
      TSR_CHECK(B.numel() == X.cols, TSR_ERR_INVALID,
                std::string(op) + ": bias " + describe(bias) + " must have " +
                    std::to_string(X.cols) + " elements, the last dim of x " + describe(x));
    }
    TSR_CHECK(W.numel() == X.cols, TSR_ERR_INVALID,
              std::string(op) + ": weight " + describe(weight) + " must have " +
                  std::to_string(X.cols) + " elements, the last dim of x " + describe(x));
    TSR_CHECK(Y.rows == X.rows && Y.cols == X.cols, TSR_ERR_INVALID,
              std::string(op) + ": y " + describe(y) + " must match x " + describe(x));
    check_same_dtype(op, "x", x, X, "y", y, Y);
    TSR_CHECK(M.numel() == X.rows && R.numel() == X.rows, TSR_ERR_INVALID,
              std::string(op) + ": mean " + describe(mean) + " and rstd " + describe(rstd) +
                  " must have one entry per row of x " + describe(x));
    TSR_CHECK(X.cols > 0 || X.rows == 0, TSR_ERR_INVALID,
              std::string(op) + ": x " + describe(x) + " has rows of no elements");
    if (X.rows == 0) return;
    const bool vec = X.cols % kPack == 0 && aligned16(X.p) && aligned16(Y.p) && aligned16(W.p) &&
                     (!bias || aligned16(B.p));
    const unsigned grid = static_cast<unsigned>((X.rows + kRowsPerBlock - 1) / kRowsPerBlock);
    dispatch_float(X.dt, [&](auto xtag) {
      using T = decltype(xtag);
      dispatch_float(W.dt, [&](auto wtag) {
        using TW = decltype(wtag);
        layernorm_forward_kernel<T, TW, false><<<grid, kThreads, 0, compute_stream()>>>(
            X.as<T>(), nullptr, nullptr, W.as<TW>(), bias ? B.as<TW>() : nullptr, eps, Y.as<T>(),
            M.as<float>(), R.as<float>(), X.rows, X.cols, vec);
        check_launch();
      });
    });
  });
}

tsr_status add_layernorm_forward(tsr_host_ctx *ctx, const DLTensor *x, const DLTensor *y,
                                 const DLTensor *weight, const DLTensor *bias, float eps,
                                 DLTensor *r, DLTensor *out, DLTensor *mean,
                                 DLTensor *rstd) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "add_layernorm_forward";
    if (side_of(op, {{"x", x},
                     {"y", y},
                     {"weight", weight},
                     {"bias", bias},
                     {"r", r},
                     {"out", out},
                     {"mean", mean},
                     {"rstd", rstd}}) == Side::Host) {
      AsCpu hx(x), hy(y), hw(weight), hb(bias), hr(r), ho(out), hm(mean), hs(rstd);
      host_result(need_cpu(cpu_ops()->add_layernorm_forward, op)(
          ctx, hx.p, hy.p, hw.p, hb.p, eps, hr.mut(), ho.mut(), hm.mut(), hs.mut()));
      return;
    }
    const View X = floating(op, "x", x, 1), Y = floating(op, "y", y, 1),
               Rs = floating(op, "r", r, 1), W = floating(op, "weight", weight),
               O = floating(op, "out", out, 1), M = f32(op, "mean", mean),
               S = f32(op, "rstd", rstd);
    View B{};
    if (bias) {
      B = floating(op, "bias", bias);
      check_same_dtype(op, "weight", weight, W, "bias", bias, B);
      TSR_CHECK(B.numel() == X.cols, TSR_ERR_INVALID,
                std::string(op) + ": bias " + describe(bias) + " must have " +
                    std::to_string(X.cols) + " elements, the last dim of x " + describe(x));
    }
    TSR_CHECK(W.numel() == X.cols, TSR_ERR_INVALID,
              std::string(op) + ": weight " + describe(weight) + " must have " +
                  std::to_string(X.cols) + " elements, the last dim of x " + describe(x));
    using Like = std::tuple<const char *, const DLTensor *, View>;
    for (const auto &[name, t, v] : {Like{"y", y, Y}, Like{"r", r, Rs}, Like{"out", out, O}}) {
      TSR_CHECK(v.rows == X.rows && v.cols == X.cols, TSR_ERR_INVALID,
                std::string(op) + ": " + name + " " + describe(t) + " must match x " + describe(x));
      check_same_dtype(op, "x", x, X, name, t, v);
    }
    TSR_CHECK(M.numel() == X.rows && S.numel() == X.rows, TSR_ERR_INVALID,
              std::string(op) + ": mean " + describe(mean) + " and rstd " + describe(rstd) +
                  " must have one entry per row of x " + describe(x));
    TSR_CHECK(X.cols > 0 || X.rows == 0, TSR_ERR_INVALID,
              std::string(op) + ": x " + describe(x) + " has rows of no elements");
    // out is written while r is read back: it may share no memory with the
    // inputs (r itself may be x or y, each element read before written).
    TSR_CHECK(!overlaps_bytes(O, X) && !overlaps_bytes(O, Y) && !overlaps_bytes(O, Rs),
              TSR_ERR_INVALID,
              std::string(op) + ": out " + describe(out) + " overlaps x, y or r in memory");
    if (X.rows == 0) return;
    const bool vec = X.cols % kPack == 0 && aligned16(X.p) && aligned16(Y.p) && aligned16(Rs.p) &&
                     aligned16(O.p) && aligned16(W.p) && (!bias || aligned16(B.p));
    const unsigned grid = static_cast<unsigned>((X.rows + kRowsPerBlock - 1) / kRowsPerBlock);
    dispatch_float(X.dt, [&](auto xtag) {
      using T = decltype(xtag);
      dispatch_float(W.dt, [&](auto wtag) {
        using TW = decltype(wtag);
        layernorm_forward_kernel<T, TW, true><<<grid, kThreads, 0, compute_stream()>>>(
            X.as<T>(), Y.as<T>(), Rs.as<T>(), W.as<TW>(), bias ? B.as<TW>() : nullptr, eps,
            O.as<T>(), M.as<float>(), S.as<float>(), X.rows, X.cols, vec);
        check_launch();
      });
    });
  });
}

namespace {

// Arguments in host memory: the CPU ops do the work. Returns whether they
// did.
bool layernorm_backward_on_host(const char *op, tsr_host_ctx *ctx, const DLTensor *dy,
                                const DLTensor *x, const DLTensor *weight, const DLTensor *mean,
                                const DLTensor *rstd, DLTensor *dx, DLTensor *dweight,
                                DLTensor *dbias, DLTensor *dsum) {
  if (side_of(op, {{"dy", dy},
                   {"x", x},
                   {"weight", weight},
                   {"mean", mean},
                   {"rstd", rstd},
                   {"dx", dx},
                   {"dweight", dweight},
                   {"dbias", dbias},
                   {"dsum", dsum}}) != Side::Host)
    return false;
  AsCpu hdy(dy), hx(x), hw(weight), hm(mean), hr(rstd), hdx(dx), hdw(dweight), hdb(dbias),
      hds(dsum);
  if (dsum)
    host_result(need_cpu(cpu_ops()->layernorm_backward_sum, op)(
        ctx, hdy.p, hx.p, hw.p, hm.p, hr.p, hdx.mut(), hdw.mut(), hdb.mut(), hds.mut()));
  else
    host_result(need_cpu(cpu_ops()->layernorm_backward, op)(ctx, hdy.p, hx.p, hw.p, hm.p, hr.p,
                                                            hdx.mut(), hdw.mut(), hdb.mut()));
  return true;
}

// layernorm_backward's device arguments, checked; DB and DS are empty
// (p == nullptr) without dbias or dsum.
struct LnbViews {
  View DY, X, W, M, R, DX, DW, DB, DS;
  bool bias, sum;
};

LnbViews layernorm_backward_views(const char *op, const DLTensor *dy, const DLTensor *x,
                                  const DLTensor *weight, const DLTensor *mean,
                                  const DLTensor *rstd, DLTensor *dx, DLTensor *dweight,
                                  DLTensor *dbias, DLTensor *dsum) {
  LnbViews v{floating(op, "dy", dy, 1),
             floating(op, "x", x, 1),
             floating(op, "weight", weight),
             f32(op, "mean", mean),
             f32(op, "rstd", rstd),
             floating(op, "dx", dx, 1),
             floating(op, "dweight", dweight),
             View{},
             View{},
             dbias != nullptr,
             dsum != nullptr};
  const View &X = v.X;
  if (dbias) {
    v.DB = floating(op, "dbias", dbias);
    TSR_CHECK(v.DB.numel() == X.cols, TSR_ERR_INVALID,
              std::string(op) + ": dbias " + describe(dbias) + " must have " +
                  std::to_string(X.cols) + " elements");
  }
  if (dsum) {
    v.DS = floating(op, "dsum", dsum);
    TSR_CHECK(v.DS.numel() == X.cols, TSR_ERR_INVALID,
              std::string(op) + ": dsum " + describe(dsum) + " must have " +
                  std::to_string(X.cols) + " elements, the last dim of x " + describe(x));
    TSR_CHECK(!overlaps_bytes(v.DS, v.DX) && !overlaps_bytes(v.DS, v.DY) &&
                  !overlaps_bytes(v.DS, X) && !overlaps_bytes(v.DS, v.DW) &&
                  (!dbias || !overlaps_bytes(v.DS, v.DB)),
              TSR_ERR_INVALID, std::string(op) + ": dsum overlaps another argument in memory");
  }
  TSR_CHECK(
      v.DY.rows == X.rows && v.DY.cols == X.cols && v.DX.rows == X.rows && v.DX.cols == X.cols,
      TSR_ERR_INVALID,
      std::string(op) + ": dy " + describe(dy) + " and dx " + describe(dx) + " must match x " +
          describe(x));
  check_same_dtype(op, "x", x, X, "dy", dy, v.DY);
  check_same_dtype(op, "x", x, X, "dx", dx, v.DX);
  TSR_CHECK(v.W.numel() == X.cols && v.DW.numel() == X.cols, TSR_ERR_INVALID,
            std::string(op) + ": weight " + describe(weight) + " and dweight " + describe(dweight) +
                " must have " + std::to_string(X.cols) + " elements");
  TSR_CHECK(v.M.numel() == X.rows && v.R.numel() == X.rows, TSR_ERR_INVALID,
            std::string(op) + ": mean " + describe(mean) + " and rstd " + describe(rstd) +
                " must have one entry per row of x " + describe(x));
  return v;
}

// Rows of whole packs: one pass (layernorm_backward_rows.cuh), then one
// finalize of its partials where the outputs share a dtype. Returns false,
// launching nothing, where the rows are not in packs or are wider than one
// pass holds.
template <typename T>
bool layernorm_backward_one_pass(const LnbViews &v, bool vec) {
  int64_t blocks = 0;
  float *rows_partial = nullptr;
  dispatch_float(v.W.dt, [&](auto wtag) {
    using TW = decltype(wtag);
    blocks = launch_layernorm_backward_rows<T, TW>(v.DY.as<T>(), v.X.as<T>(), v.W.as<TW>(),
                                                   v.M.as<float>(), v.R.as<float>(), v.DX.as<T>(),
                                                   v.X.rows, v.X.cols, vec, v.sum, &rows_partial);
  });
  if (blocks <= 0) return false;
  const int64_t blk = blocks * v.X.cols;
  if (v.bias && v.DB.dt == v.DW.dt && (!v.sum || v.DS.dt == v.DW.dt)) {
    const View outs[3] = {v.DW, v.DB, v.DS};
    launch_col_finalize(rows_partial, blocks, outs, v.sum ? 3 : 2);
  } else {
    launch_col_finalize(rows_partial, blocks, v.DW);
    if (v.bias) launch_col_finalize(rows_partial + blk, blocks, v.DB);
    if (v.sum) launch_col_finalize(rows_partial + 2 * blk, blocks, v.DS);
  }
  return true;
}

// The other rows: the parameter gradients first, since they read dy, which
// dx may alias. Their partials, and dsum's (below) where it shares their
// dtype and chunks, go into one buffer that one finalize launch finishes.
template <typename T>
void layernorm_backward_columns(const LnbViews &v, bool vec) {
  const View &X = v.X, &DY = v.DY, &DX = v.DX, &DW = v.DW, &DB = v.DB, &DS = v.DS;
  const unsigned grid = static_cast<unsigned>((X.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  int64_t rpc = 0;
  const int64_t chunks = col_plan(X.rows, X.cols, col_vec(X.cols, DY.p, X.p), &rpc);
  const bool one_finish =
      (!v.bias || DB.dt == DW.dt) &&
      (!v.sum || (v.bias && DS.dt == DW.dt &&
                  col_plan(X.rows, X.cols, col_vec(X.cols, DX.p, nullptr), &rpc) == chunks));
  const size_t block = static_cast<size_t>(chunks * X.cols);
  float *partial = static_cast<float *>(
      scratch(Slot::Partials, sizeof(float) * block * (one_finish && v.sum ? 3 : 2)));
  int64_t got = 0;
  launch_col_partials<T, true>(DY.as<T>(), X.as<T>(), v.M.as<float>(), v.R.as<float>(), X.rows,
                               X.cols, &got, partial);
  if (!one_finish) {
    launch_col_finalize(partial, chunks, DW);
    if (v.bias) launch_col_finalize(partial + block, chunks, DB);
  }
  dispatch_float(v.W.dt, [&](auto wtag) {
    using TW = decltype(wtag);
    layernorm_dx_kernel<T, TW><<<grid, kThreads, 0, compute_stream()>>>(
        DY.as<T>(), X.as<T>(), v.W.as<TW>(), v.M.as<float>(), v.R.as<float>(), DX.as<T>(), X.rows,
        X.cols, vec);
    check_launch();
  });
  // dsum: the column sums of dx as stored, a separate pass over dx here.
  // (Rows of packs take the one-pass form above; two earlier one-pass
  // forms, a warp a row with all the partials of its 24 columns a lane,
  // were slower: bench/results/gpt2_gpu-2026-12-02-third.md.)
  if (one_finish) {
    if (v.sum)
      launch_col_partials<T, false>(DX.as<T>(), nullptr, nullptr, nullptr, X.rows, X.cols, &got,
                                    partial + 2 * block);
    const View outs[3] = {DW, DB, DS};
    launch_col_finalize(partial, chunks, outs, v.bias ? (v.sum ? 3 : 2) : 1);
  } else if (v.sum) {
    launch_bias_grad(DX, DS, 1.0f);
  }
}

// layernorm_backward, and with dsum layernorm_backward_sum (op names which).
void layernorm_backward_impl(const char *op, tsr_host_ctx *ctx, const DLTensor *dy,
                             const DLTensor *x, const DLTensor *weight, const DLTensor *mean,
                             const DLTensor *rstd, DLTensor *dx, DLTensor *dweight, DLTensor *dbias,
                             DLTensor *dsum) {
  if (layernorm_backward_on_host(op, ctx, dy, x, weight, mean, rstd, dx, dweight, dbias, dsum))
    return;
  const LnbViews v =
      layernorm_backward_views(op, dy, x, weight, mean, rstd, dx, dweight, dbias, dsum);
  if (v.X.rows == 0 || v.X.cols == 0) return;
  const bool vec = v.X.cols % kPack == 0 && aligned16(v.X.p) && aligned16(v.DY.p) &&
                   aligned16(v.DX.p) && aligned16(v.W.p);
  dispatch_float(v.X.dt, [&](auto xtag) {
    using T = decltype(xtag);
    if (!layernorm_backward_one_pass<T>(v, vec)) layernorm_backward_columns<T>(v, vec);
  });
}

}  // namespace

tsr_status layernorm_backward(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                              const DLTensor *weight, const DLTensor *mean, const DLTensor *rstd,
                              DLTensor *dx, DLTensor *dweight, DLTensor *dbias) noexcept {
  return guarded(ctx, [&] {
    layernorm_backward_impl("layernorm_backward", ctx, dy, x, weight, mean, rstd, dx, dweight,
                            dbias, nullptr);
  });
}

tsr_status layernorm_backward_sum(tsr_host_ctx *ctx, const DLTensor *dy, const DLTensor *x,
                                  const DLTensor *weight, const DLTensor *mean,
                                  const DLTensor *rstd, DLTensor *dx, DLTensor *dweight,
                                  DLTensor *dbias, DLTensor *dsum) noexcept {
  return guarded(ctx, [&] {
    layernorm_backward_impl("layernorm_backward_sum", ctx, dy, x, weight, mean, rstd, dx, dweight,
                            dbias, dsum);
  });
}

}  // namespace tessera::cuda
