// CPU ops, embedding lookup: out[i, :] = table[ids[i], :] (or +=, so token
// and position embeddings can sum into one buffer), and its backward, a
// scatter-add of the output gradient into the table's gradient.
#include "backend/cpu/cpu_ops_internal.hpp"
#include "util/error.hpp"

namespace tessera::cpu {

namespace {

// The shared checks: ids int32 (any shape, one per row of `rows_arg`),
// table 2-D [vocab, C], rows_arg [.., C]. Every id is checked before the
// caller writes anything, so a bad id leaves the outputs untouched.
Mat<int32_t> check(const char *op, const DLTensor *ids, const char *table_arg,
                   const DLTensor *table, const Mat<float> &T, const char *rows_arg,
                   const DLTensor *rows_t, const Mat<float> &O) {
  const Mat<int32_t> I = i32(op, "ids", ids);
  TSR_CHECK(table->ndim == 2, TSR_ERR_INVALID,
            std::string(op) + ": " + table_arg + " must be 2-D [vocab, C], got " + describe(table));
  TSR_CHECK(O.cols == T.cols, TSR_ERR_INVALID,
            std::string(op) + ": the last dim of " + rows_arg + " " + describe(rows_t) +
                " must be the last dim of " + table_arg + " " + describe(table));
  TSR_CHECK(O.rows == I.numel(), TSR_ERR_INVALID,
            std::string(op) + ": " + rows_arg + " " + describe(rows_t) +
                " must have one row per id (ids " + describe(ids) + ": " +
                std::to_string(I.numel()) + " ids)");
  const int64_t vocab = T.rows;
  for (int64_t i = 0; i < I.numel(); i++) {
    const int32_t id = I.p[i];
    TSR_CHECK(id >= 0 && id < vocab, TSR_ERR_INVALID,
              std::string(op) + ": id " + std::to_string(id) + " at row " + std::to_string(i) +
                  " of ids " + describe(ids) + " is outside [0, " + std::to_string(vocab) + ") (" +
                  table_arg + " " + describe(table) + ")");
  }
  return I;
}

}  // namespace

tsr_status embedding_forward(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *table,
                             DLTensor *out, int32_t accumulate) noexcept {
  return guarded(ctx, [&] {
    const char *op = "embedding_forward";
    const Mat<float> T = f32(op, "table", table, 2), O = f32(op, "out", out, 1);
    TSR_CHECK(accumulate == 0 || accumulate == 1, TSR_ERR_INVALID,
              std::string(op) + ": accumulate must be 0 or 1, got " + std::to_string(accumulate));
    const Mat<int32_t> I = check(op, ids, "table", table, T, "out", out, O);
    const int64_t C = T.cols;
    // Row by row: each output row and its table row are contiguous runs.
    for (int64_t i = 0; i < I.numel(); i++) {
      const float *src = T.p + static_cast<int64_t>(I.p[i]) * C;
      float *dst = O.p + i * C;
      if (accumulate) {
        for (int64_t j = 0; j < C; j++) dst[j] += src[j];
      } else {
        for (int64_t j = 0; j < C; j++) dst[j] = src[j];
      }
    }
  });
}

tsr_status embedding_backward(tsr_host_ctx *ctx, const DLTensor *ids, const DLTensor *dout,
                              DLTensor *dtable) noexcept {
  return guarded(ctx, [&] {
    const char *op = "embedding_backward";
    const Mat<float> D = f32(op, "dtable", dtable, 2), G = f32(op, "dout", dout, 1);
    const Mat<int32_t> I = check(op, ids, "dtable", dtable, D, "dout", dout, G);
    const int64_t C = D.cols;
    // In row order, so an id that repeats accumulates its rows in a fixed
    // order and the result is deterministic.
    for (int64_t i = 0; i < I.numel(); i++) {
      float *dst = D.p + static_cast<int64_t>(I.p[i]) * C;
      const float *src = G.p + i * C;
      for (int64_t j = 0; j < C; j++) dst[j] += src[j];
    }
  });
}

}  // namespace tessera::cpu
