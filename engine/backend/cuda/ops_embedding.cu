// CUDA ops: embedding forward (gather rows of a float32, bfloat16 or
// float16 table, optionally added into out) and backward (add dout's rows
// into the table rows their ids name). Semantics follow the CPU ops
// (backend/cpu/cpu_ops_nn.cpp).
//
// Deterministic: the backward sorts the ids, then sums each id's rows in
// position order and adds the sum into its table row once.
#include <cub/device/device_radix_sort.cuh>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cuda/cuda_ops_internal.hpp"
#include "backend/cuda/known_ids.hpp"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------
// Embedding. Ids are checked on the device first (the lowest row holding an
// id outside [0, vocab)), and the result read back before anything is
// written, so a bad id fails the call cleanly; a batch the loader uploaded
// was seen by the host, and is checked there (backend/cuda/known_ids.hpp).

// The backward's layout: one warp per sorted entry.
constexpr int kRowsPerBlock = kThreads / 32;

__global__ void ids_check(const int32_t *ids, int64_t rows, int64_t vocab, long long *bad_row) {
  for (int64_t r = global_thread(); r < rows; r += global_threads())
    if (ids[r] < 0 || ids[r] >= vocab) atomicMin(bad_row, static_cast<long long>(r));
}

template <typename T>
__global__ void embedding_gather(const int32_t *ids, const T *table, T *out, int64_t n, int64_t C,
                                 bool vec, bool accumulate) {
  if (vec) {
    const int64_t packs = n / kPack;
    for (int64_t p = global_thread(); p < packs; p += global_threads()) {
      const int64_t i = p * kPack, r = i / C, c = i % C;
      float v[kPack];
      load8(table + static_cast<int64_t>(ids[r]) * C + c, v);
      if (accumulate) {
        float o[kPack];
        load8(out + i, o);
#pragma unroll
        for (int j = 0; j < kPack; j++) v[j] += o[j];
      }
      store8(out + i, v);
    }
    return;
  }
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    const int64_t r = i / C, c = i % C;
    float v = to_f(table[static_cast<int64_t>(ids[r]) * C + c]);
    if (accumulate) v += to_f(out[i]);
    out[i] = from_f<T>(v);
  }
}

__global__ void iota(int32_t *p, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) p[i] = static_cast<int32_t>(i);
}

// After sorting (id, position) pairs by id (stably, so positions ascend
// within an id): one warp per sorted entry; the warp at the start of each
// run of equal ids sums that run's dout rows in position order in float32
// and adds the sum into the table row once. Deterministic, and each table
// element is rounded once whatever its dtype.
template <typename T>
__global__ void embedding_scatter(const int32_t *sorted_ids, const int32_t *positions,
                                  const T *dout, T *dtable, int64_t rows, int64_t C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (k >= rows) return;
  const int32_t id = sorted_ids[k];
  if (k > 0 && sorted_ids[k - 1] == id) return;
  int64_t end = k + 1;
  while (end < rows && sorted_ids[end] == id) end++;
  T *dst = dtable + static_cast<int64_t>(id) * C;
  const int64_t packs = vec ? C / kPack : 0;
  for (int64_t p = lane; p < packs; p += 32) {
    float acc[kPack] = {};
    for (int64_t q = k; q < end; q++) {
      float v[kPack];
      load8(dout + static_cast<int64_t>(positions[q]) * C + p * kPack, v);
#pragma unroll
      for (int j = 0; j < kPack; j++) acc[j] += v[j];
    }
    float o[kPack];
    load8(dst + p * kPack, o);
#pragma unroll
    for (int j = 0; j < kPack; j++) o[j] += acc[j];
    store8(dst + p * kPack, o);
  }
  for (int64_t c = packs * kPack + lane; c < C; c += 32) {
    float acc = 0.0f;
    for (int64_t q = k; q < end; q++) acc += to_f(dout[static_cast<int64_t>(positions[q]) * C + c]);
    dst[c] = from_f<T>(to_f(dst[c]) + acc);
  }
}

// The lowest row of `ids` outside [0, vocab), or -1: one small kernel and a
// read-back (a synchronization: the price of failing before writing), unless
// the ids are a batch the host uploaded and saw within range already.
int64_t first_bad_id(const View &ids, int64_t vocab) {
  if (ints_known_in(ids.p, ids.bytes(), vocab)) return -1;
  long long *flag = static_cast<long long *>(scratch(Slot::Flags, sizeof(long long)));
  cudaStream_t stream = compute_stream();
  TSR_CUDA_CHECK(cudaMemsetAsync(flag, 0x7f, sizeof(long long), stream));
  ids_check<<<grid_for(ids.numel(), kThreads), kThreads, 0, stream>>>(ids.as<int32_t>(),
                                                                      ids.numel(), vocab, flag);
  check_launch();
  long long bad = 0;
  read_back(&bad, flag, sizeof(bad));
  return bad == kNoBadRow ? -1 : static_cast<int64_t>(bad);
}

std::string bad_id_message(const char *op, const View &ids, const DLTensor *ids_t, int64_t row,
                           int64_t vocab) {
  int32_t id = 0;
  TSR_CUDA_CHECK(cudaMemcpy(&id, ids.as<int32_t>() + row, sizeof(id), cudaMemcpyDeviceToHost));
  return std::string(op) + ": ids " + describe(ids_t) + " row " + std::to_string(row) +
         " holds id " + std::to_string(id) + ", outside [0, " + std::to_string(vocab) + ")";
}

}  // namespace

tsr_status embedding_forward(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *table,
                             DLTensor *out, int32_t accumulate) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "embedding_forward";
    if (side_of(op, {{"ids", ids}, {"table", table}, {"out", out}}) == Side::Host) {
      AsCpu hi(ids), ht(table), ho(out);
      host_result(
          need_cpu(cpu_ops()->embedding_forward, op)(ctx, hi.p, ht.p, ho.mut(), accumulate));
      return;
    }
    const View I = i32(op, "ids", ids), T = floating(op, "table", table, 2),
               O = floating(op, "out", out, 1);
    TSR_CHECK(table->ndim == 2, TSR_ERR_INVALID,
              std::string(op) + ": table must be 2-D [vocab, C], got " + describe(table));
    TSR_CHECK(O.rows == I.numel() && O.cols == T.cols, TSR_ERR_INVALID,
              std::string(op) + ": out " + describe(out) + " must be [" +
                  std::to_string(I.numel()) + ", " + std::to_string(T.cols) + "] for ids " +
                  describe(ids) + " and table " + describe(table));
    check_same_dtype(op, "table", table, T, "out", out, O);
    TSR_CHECK(accumulate == 0 || accumulate == 1, TSR_ERR_INVALID,
              std::string(op) + ": accumulate must be 0 or 1, got " + std::to_string(accumulate));
    if (O.numel() == 0) return;
    const int64_t bad = first_bad_id(I, T.rows);
    TSR_CHECK(bad < 0, TSR_ERR_INVALID, bad_id_message(op, I, ids, bad, T.rows));
    const bool vec = T.cols % kPack == 0 && aligned16(T.p) && aligned16(O.p);
    const int64_t n = O.numel();
    dispatch_float(T.dt, [&](auto tag) {
      using TT = decltype(tag);
      embedding_gather<TT>
          <<<grid_for(vec ? n / kPack : n, kThreads), kThreads, 0, compute_stream()>>>(
              I.as<int32_t>(), T.as<TT>(), O.as<TT>(), n, T.cols, vec, accumulate != 0);
      check_launch();
    });
  });
}

tsr_status embedding_backward(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *dout,
                              DLTensor *dtable) noexcept {
  return guarded(ctx, [&] {
    constexpr const char *op = "embedding_backward";
    if (side_of(op, {{"ids", ids}, {"dout", dout}, {"dtable", dtable}}) == Side::Host) {
      AsCpu hi(ids), hd(dout), ht(dtable);
      host_result(need_cpu(cpu_ops()->embedding_backward, op)(ctx, hi.p, hd.p, ht.mut()));
      return;
    }
    const View I = i32(op, "ids", ids), D = floating(op, "dout", dout, 1),
               T = floating(op, "dtable", dtable, 2);
    TSR_CHECK(dtable->ndim == 2, TSR_ERR_INVALID,
              std::string(op) + ": dtable must be 2-D [vocab, C], got " + describe(dtable));
    TSR_CHECK(D.rows == I.numel() && D.cols == T.cols, TSR_ERR_INVALID,
              std::string(op) + ": dout " + describe(dout) + " must be [" +
                  std::to_string(I.numel()) + ", " + std::to_string(T.cols) + "] for ids " +
                  describe(ids) + " and dtable " + describe(dtable));
    check_same_dtype(op, "dout", dout, D, "dtable", dtable, T);
    const int64_t rows = I.numel();
    TSR_CHECK(rows < (int64_t(1) << 31), TSR_ERR_UNSUPPORTED,
              std::string(op) + ": too many ids " + describe(ids));
    if (rows == 0 || T.cols == 0) return;
    const int64_t bad = first_bad_id(I, T.rows);
    TSR_CHECK(bad < 0, TSR_ERR_INVALID, bad_id_message(op, I, ids, bad, T.rows));

    // Sort (id, position) by id; ids are now known to lie in [0, vocab), so
    // only the low bits take part.
    cudaStream_t stream = compute_stream();
    const size_t n = static_cast<size_t>(rows), ints = (n + 63) / 64 * 64;
    int32_t *buf = static_cast<int32_t *>(scratch(Slot::SortA, sizeof(int32_t) * ints * 3));
    int32_t *keys_out = buf, *vals_in = buf + ints, *vals_out = buf + 2 * ints;
    int end_bit = 1;
    while (end_bit < 31 && (int64_t(1) << end_bit) < T.rows) end_bit++;
    const auto *keys_in = reinterpret_cast<const unsigned *>(I.as<int32_t>());
    auto *keys_sorted = reinterpret_cast<unsigned *>(keys_out);
    size_t temp_bytes = 0;
    TSR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_sorted,
                                                   vals_in, vals_out, static_cast<int>(n), 0,
                                                   end_bit, stream));
    void *temp = scratch(Slot::SortB, temp_bytes);
    iota<<<grid_for(rows, kThreads), kThreads, 0, stream>>>(vals_in, rows);
    check_launch();
    TSR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_sorted, vals_in,
                                                   vals_out, static_cast<int>(n), 0, end_bit,
                                                   stream));
    const bool vec = T.cols % kPack == 0 && aligned16(T.p) && aligned16(D.p);
    const unsigned grid = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    dispatch_float(T.dt, [&](auto tag) {
      using TT = decltype(tag);
      embedding_scatter<TT><<<grid, kThreads, 0, stream>>>(keys_out, vals_out, D.as<TT>(),
                                                           T.as<TT>(), rows, T.cols, vec);
      check_launch();
    });
  });
}

}  // namespace tessera::cuda
