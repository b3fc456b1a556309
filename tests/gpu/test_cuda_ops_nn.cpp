// The CUDA ops of the network layers against the CPU ops and references in
// double (cuda_ops_support.hpp says how dtypes are compared): bias_act,
// bias_grad, the activations forward and backward, cross_entropy, layernorm
// and embedding.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/known_ids.hpp"
#include "cuda_ops_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_cuda_ops_nn {

using namespace cuda_ops_test;

// ===========================================================================
// bias_act, bias_grad, activations

TEST_CASE("cuda bias_act matches the CPU", "[cuda][ops]") {
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{37, 48}, {5, 7, 13}}) {
      const int64_t cols = shape.back(), n = numel_of(shape);
      for (tsr_activation act : kActs) {
        Gpu y(shape, d, randn(n, 21)), bias({cols}, d, randn(cols, 22));
        Cpu cy(shape, y.vals), cb({cols}, bias.vals);
        REQUIRE_OK(gpu().bias_act(ctx(), y.dl(), bias.dl(), act));
        REQUIRE_OK(cpu().bias_act(ctx(), cy.dl(), cb.dl(), act));
        expect_close(case_name("bias_act", d, shape, act_name(act)), y.get(), cy.get(), tol(d));
      }
    }
  }
}

TEST_CASE("cuda bias_grad matches the CPU and repeats bit for bit", "[cuda][ops]") {
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{300, 40}, {129, 13}, {4, 1024, 64}, {1, 8}}) {
      const int64_t cols = shape.back(), n = numel_of(shape);
      Gpu dy(shape, d, randn(n, 31)), db({cols}, d, randn(cols, 32));
      Cpu cdy(shape, dy.vals), cdb({cols}, db.vals);
      REQUIRE_OK(gpu().bias_grad(ctx(), dy.dl(), db.dl()));
      REQUIRE_OK(cpu().bias_grad(ctx(), cdy.dl(), cdb.dl()));
      const std::vector<float> first = db.get();
      expect_close(case_name("bias_grad", d, shape), first, cdb.get(), tol(d));
      db.set(db.vals);
      REQUIRE_OK(gpu().bias_grad(ctx(), dy.dl(), db.dl()));
      CHECK(db.get() == first);
    }
  }
}

TEST_CASE("cuda act_forward and act_backward match the CPU, aliasing included", "[cuda][ops]") {
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{33, 64}, {1001}}) {
      const int64_t n = numel_of(shape);
      for (tsr_activation act : kActs) {
        // forward, out of place and in place
        Gpu x(shape, d, randn(n, 41, -4, 4));
        Tensor y(shape, d);
        Cpu cx(shape, x.vals), cy(shape, std::vector<float>(n));
        REQUIRE_OK(gpu().act_forward(ctx(), act, x.dl(), y.dl()));
        REQUIRE_OK(cpu().act_forward(ctx(), act, cx.dl(), cy.dl()));
        expect_close(case_name("act_forward", d, shape, act_name(act)), y.get(), cy.get(), tol(d));
        REQUIRE_OK(gpu().act_forward(ctx(), act, x.dl(), x.dl()));
        expect_close(case_name("act_forward in place", d, shape, act_name(act)), x.get(), cy.get(),
                     tol(d));

        // backward from the input (and from the output for relu and tanh),
        // into a separate dx and into dy itself
        for (int from_output = 0; from_output < 2; from_output++) {
          if (from_output && act == TSR_ACT_GELU) continue;
          Gpu xin(shape, d, randn(n, 42, -4, 4));
          std::vector<float> src = xin.vals;
          if (from_output) {
            for (float &v : src) v = round_to(d, static_cast<float>(ref_act(act, v)));
          }
          Gpu xs(shape, d, src), dy(shape, d, randn(n, 43));
          Tensor dx(shape, d);
          Cpu cxs(shape, xs.vals), cdy(shape, dy.vals), cdx(shape, std::vector<float>(n));
          const std::string what =
              case_name("act_backward", d, shape,
                        std::string(act_name(act)) + " from_output=" + std::to_string(from_output));
          REQUIRE_OK(gpu().act_backward(ctx(), act, xs.dl(), from_output, dy.dl(), dx.dl()));
          REQUIRE_OK(cpu().act_backward(ctx(), act, cxs.dl(), from_output, cdy.dl(), cdx.dl()));
          const std::vector<float> want = cdx.get();
          expect_close(what, dx.get(), want, tol(d));
          REQUIRE_OK(gpu().act_backward(ctx(), act, xs.dl(), from_output, dy.dl(), dy.dl()));
          expect_close(what + " dx == dy", dy.get(), want, tol(d));
        }
      }
    }
  }
  Gpu x({8}, Dt::F32, randn(8, 1)), y({8}, Dt::BF16, randn(8, 1));
  CHECK(gpu().act_forward(ctx(), TSR_ACT_RELU, x.dl(), y.dl()) == TSR_ERR_UNSUPPORTED);
  CHECK_THAT(last_error(), Catch::Contains("same dtype"));
  CHECK(gpu().act_backward(ctx(), TSR_ACT_GELU, x.dl(), 1, x.dl(), x.dl()) == TSR_ERR_INVALID);
  CHECK(gpu().act_forward(ctx(), 7, x.dl(), x.dl()) == TSR_ERR_INVALID);
}

// ===========================================================================
// cross_entropy

TEST_CASE("cuda cross_entropy matches the CPU: padding, ignored rows, aliasing", "[cuda][ops]") {
  struct Case {
    int64_t rows, cols, valid;
  };
  for (Dt d : kFloatDts) {
    // Wide rows of uneven lengths too (20008, 130000 columns): the layouts a
    // split of a row over several blocks would get wrong.
    for (Case cs : {Case{33, 50, 45}, Case{16, 64, 0}, Case{8, 50304, 50257}, Case{3, 7, 0},
                    Case{6, 20008, 20001}, Case{3, 130000, 129999}}) {
      for (int alias = 0; alias < 2; alias++) {
        const std::vector<int64_t> shape{cs.rows, cs.cols};
        const int64_t V = cs.valid > 0 ? cs.valid : cs.cols;
        Gpu logits(shape, d, randn(cs.rows * cs.cols, 51, -6, 6));
        std::vector<int32_t> t(cs.rows);
        std::mt19937 rng(52);
        for (int64_t r = 0; r < cs.rows; r++)
          t[r] = r % 5 == 3 ? -1 : static_cast<int32_t>(rng() % V);
        if (cs.rows > 2) {  // a row whose argmax is its target
          int64_t best = 0;
          for (int64_t j = 1; j < V; j++)
            if (logits.vals[2 * cs.cols + j] > logits.vals[2 * cs.cols + best]) best = j;
          t[2] = static_cast<int32_t>(best);
        }
        Tensor targets({cs.rows}, Dt::I32), dl(shape, d);
        targets.set_i32(t);
        Tensor ctg({cs.rows}, Dt::I32, kDLCPU);
        ctg.set_i32(t);
        Cpu cl(shape, logits.vals), cdl(shape, std::vector<float>(cs.rows * cs.cols));
        double loss = 0, closs = 0;
        int64_t count = 0, ccount = 0, correct = 0, ccorrect = 0;
        const std::string what =
            case_name("cross_entropy", d, shape,
                      "valid=" + std::to_string(cs.valid) + " alias=" + std::to_string(alias));
        INFO(what);
        REQUIRE_OK(gpu().cross_entropy(ctx(), logits.dl(), targets.dl(), cs.valid, 0.5f,
                                       alias ? logits.dl() : dl.dl(), &loss, &count, &correct));
        REQUIRE_OK(cpu().cross_entropy(ctx(), cl.dl(), ctg.dl(), cs.valid, 0.5f, cdl.dl(), &closs,
                                       &ccount, &ccorrect));
        CHECK(count == ccount);
        CHECK(correct == ccorrect);
        CHECK(std::fabs(loss - closs) <= 1e-5 * std::fabs(closs) + 1e-6);
        expect_close(what + " dlogits", alias ? logits.get() : dl.get(), cdl.get(),
                     d == Dt::F32 ? 1e-5 : tol(d));
      }
    }
  }
}

TEST_CASE("cuda cross_entropy without dlogits, and a bad target writes nothing", "[cuda][ops]") {
  Gpu logits({4, 10}, Dt::BF16, randn(40, 61));
  Tensor targets({4}, Dt::I32);
  targets.set_i32({1, 2, 3, 4});
  double loss = 0;
  int64_t count = 0;
  REQUIRE_OK(gpu().cross_entropy(ctx(), logits.dl(), targets.dl(), 0, 1.0f, nullptr, &loss, &count,
                                 nullptr));
  CHECK(count == 4);
  CHECK(loss > 0);

  // Wide rows without dlogits: the loss of the pass with.
  Gpu wide({3, 50304}, Dt::BF16, randn(3 * 50304, 62, -4, 4));
  Tensor wt({3}, Dt::I32), wd({3, 50304}, Dt::BF16);
  wt.set_i32({7, -1, 50000});
  double l0 = 0, l1 = 0;
  int64_t n0 = 0, n1 = 0;
  REQUIRE_OK(
      gpu().cross_entropy(ctx(), wide.dl(), wt.dl(), 50257, 1.0f, nullptr, &l0, &n0, nullptr));
  REQUIRE_OK(
      gpu().cross_entropy(ctx(), wide.dl(), wt.dl(), 50257, 1.0f, wd.dl(), &l1, &n1, nullptr));
  CHECK(n0 == 2);
  CHECK(n1 == 2);
  CHECK(l0 == l1);

  targets.set_i32({1, 2, 9, 4});
  const std::vector<float> before = logits.get();
  host().clear_error();
  CHECK(gpu().cross_entropy(ctx(), logits.dl(), targets.dl(), 8, 1.0f, logits.dl(), &loss, &count,
                            nullptr) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("row 2 has target 9 but only 8 valid classes"));
  CHECK(logits.get() == before);
}

// ===========================================================================
// layernorm: against a double reference

TEST_CASE("cuda layernorm forward and backward", "[cuda][ops]") {
  const float eps = 1e-5f;
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{37, 96}, {2, 5, 50}, {3, 768}, {2050, 768}}) {
      const int64_t C = shape.back(), rows = numel_of(shape) / C, n = rows * C;
      for (int alias = 0; alias < 2; alias++) {
        Gpu x(shape, d, randn(n, 101, -3, 3)), w({C}, d, randn(C, 102)), b({C}, d, randn(C, 103));
        Tensor y(shape, d), mean({rows}, Dt::F32), rstd({rows}, Dt::F32);
        const std::string what = case_name("layernorm", d, shape, alias ? "dx == dy" : "");
        INFO(what);
        REQUIRE_OK(gpu().layernorm_forward(ctx(), x.dl(), w.dl(), b.dl(), eps, y.dl(), mean.dl(),
                                           rstd.dl()));
        std::vector<double> wy(n), wm(rows), wr(rows), norm(n);
        for (int64_t r = 0; r < rows; r++) {
          double m = 0, v = 0;
          for (int64_t j = 0; j < C; j++) m += x.vals[r * C + j];
          m /= C;
          for (int64_t j = 0; j < C; j++) v += (x.vals[r * C + j] - m) * (x.vals[r * C + j] - m);
          v /= C;
          const double s = 1 / std::sqrt(v + eps);
          wm[r] = m, wr[r] = s;
          for (int64_t j = 0; j < C; j++) {
            norm[r * C + j] = (x.vals[r * C + j] - m) * s;
            wy[r * C + j] = norm[r * C + j] * w.vals[j] + b.vals[j];
          }
        }
        expect_close(what + " y", y.get(), wy, tol(d));
        expect_close(what + " mean", mean.get(), wm, 1e-5);
        expect_close(what + " rstd", rstd.get(), wr, 1e-5);

        // backward; dx, dweight, dbias accumulate into what they hold
        Gpu dy(shape, d, randn(n, 104)), dx(shape, d, randn(n, 105)), dw({C}, d, randn(C, 106)),
            db({C}, d, randn(C, 107));
        const std::vector<float> dx0 = alias ? dy.vals : dx.vals;
        REQUIRE_OK(gpu().layernorm_backward(ctx(), dy.dl(), x.dl(), w.dl(), mean.dl(), rstd.dl(),
                                            alias ? dy.dl() : dx.dl(), dw.dl(), db.dl()));
        // The reference uses the GPU's mean and rstd, as the op does.
        const std::vector<float> gm = mean.get(), gr = rstd.get();
        std::vector<double> wdx(n), wdw(dw.vals.begin(), dw.vals.end()),
            wdb(db.vals.begin(), db.vals.end());
        for (int64_t r = 0; r < rows; r++) {
          double ma = 0, mb = 0;
          for (int64_t j = 0; j < C; j++) {
            const double nv = (x.vals[r * C + j] - gm[r]) * double(gr[r]);
            const double dn = double(dy.vals[r * C + j]) * w.vals[j];
            ma += dn, mb += dn * nv;
            wdw[j] += dy.vals[r * C + j] * nv;
            wdb[j] += dy.vals[r * C + j];
          }
          ma /= C, mb /= C;
          for (int64_t j = 0; j < C; j++) {
            const double nv = (x.vals[r * C + j] - gm[r]) * double(gr[r]);
            const double dn = double(dy.vals[r * C + j]) * w.vals[j];
            wdx[r * C + j] = dx0[r * C + j] + gr[r] * (dn - ma - nv * mb);
          }
        }
        expect_close(what + " dx", alias ? dy.get() : dx.get(), wdx, tol(d));
        expect_close(what + " dweight", dw.get(), wdw, tol(d));
        expect_close(what + " dbias", db.get(), wdb, tol(d));
      }
    }
  }
}

// ABI 1.4's layernorm_backward_sum against the CPU op, at GPT-2's widths
// (768, 1600, 2560: vectorized rows, the one-pass form), with few rows and
// with many rows a block, a width not in 8-element packs and two wider than
// the one-pass form's shared memory holds (4096, 8200: the multi-pass
// form), with dx its own buffer or dy's; and again from the same inputs,
// bit for bit.
TEST_CASE("cuda layernorm_backward_sum matches the CPU and repeats bit for bit", "[cuda][ops]") {
  const float eps = 1e-5f;
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{64, 768},
                                       {33, 1600},
                                       {17, 2560},
                                       {4, 2, 36},
                                       {3, 8200},
                                       {5, 4096},
                                       {300, 64},
                                       // Many rows a block: every row group of
                                       // the one-pass form, and its partials.
                                       {4099, 768},
                                       {1500, 1600},
                                       {700, 2560}}) {
      const int64_t C = shape.back(), rows = numel_of(shape) / C, n = rows * C;
      for (int alias = 0; alias < 2; alias++) {
        const std::string what =
            case_name("layernorm_backward_sum", d, shape, alias ? "dx == dy" : "");
        INFO(what);
        Gpu x(shape, d, randn(n, 121, -3, 3)), w({C}, d, randn(C, 122)), b({C}, d, randn(C, 123));
        Tensor y(shape, d), mean({rows}, Dt::F32), rstd({rows}, Dt::F32);
        REQUIRE_OK(gpu().layernorm_forward(ctx(), x.dl(), w.dl(), b.dl(), eps, y.dl(), mean.dl(),
                                           rstd.dl()));
        Cpu cx(shape, x.vals), cw({C}, w.vals), cm({rows}, mean.get()), cr({rows}, rstd.get());
        std::vector<float> first[4];
        for (int rep = 0; rep < 2; rep++) {
          Gpu dy(shape, d, randn(n, 124)), dx(shape, d, randn(n, 125)), dw({C}, d, randn(C, 126)),
              db({C}, d, randn(C, 127)), ds({C}, d, randn(C, 128));
          Cpu cdy(shape, dy.vals), cdx(shape, dx.vals), cdw({C}, dw.vals), cdb({C}, db.vals),
              cds({C}, ds.vals);
          REQUIRE_OK(gpu().layernorm_backward_sum(ctx(), dy.dl(), x.dl(), w.dl(), mean.dl(),
                                                  rstd.dl(), alias ? dy.dl() : dx.dl(), dw.dl(),
                                                  db.dl(), ds.dl()));
          REQUIRE_OK(cpu().layernorm_backward_sum(ctx(), cdy.dl(), cx.dl(), cw.dl(), cm.dl(),
                                                  cr.dl(), alias ? cdy.dl() : cdx.dl(), cdw.dl(),
                                                  cdb.dl(), cds.dl()));
          const std::vector<float> got[4] = {alias ? dy.get() : dx.get(), dw.get(), db.get(),
                                             ds.get()};
          if (rep == 1) {
            for (int i = 0; i < 4; i++) CHECK(got[i] == first[i]);
            continue;
          }
          expect_close(what + " dx", got[0], alias ? cdy.get() : cdx.get(), tol(d));
          expect_close(what + " dweight", got[1], cdw.get(), tol(d));
          expect_close(what + " dbias", got[2], cdb.get(), tol(d));
          expect_close(what + " dsum", got[3], cds.get(), tol(d));
          for (int i = 0; i < 4; i++) first[i] = got[i];
        }
      }
    }
  }
}

// ===========================================================================
// embedding: against a double reference

TEST_CASE("cuda embedding forward and backward", "[cuda][ops]") {
  for (Dt d : kFloatDts) {
    for (int64_t C : {64, 13}) {
      const int64_t vocab = 50, rows = 300;
      std::vector<int32_t> ids(rows);
      std::mt19937 rng(111);
      for (auto &i : ids) i = static_cast<int32_t>(rng() % 20);  // many repeats
      ids[7] = vocab - 1;
      Tensor tids({3, 100}, Dt::I32);
      tids.set_i32(ids);
      Gpu table({vocab, C}, d, randn(vocab * C, 112));
      for (int acc = 0; acc < 2; acc++) {
        Gpu out({3, 100, C}, d, randn(rows * C, 113));
        const std::string what =
            case_name("embedding_forward", d, {vocab, C}, "accumulate=" + std::to_string(acc));
        REQUIRE_OK(gpu().embedding_forward(ctx(), tids.dl(), table.dl(), out.dl(), acc));
        std::vector<double> want(rows * C);
        for (int64_t i = 0; i < rows; i++)
          for (int64_t j = 0; j < C; j++)
            want[i * C + j] = table.vals[ids[i] * C + j] + (acc ? out.vals[i * C + j] : 0.0);
        expect_close(what, out.get(), want, tol(d));
      }
      Gpu dout({rows, C}, d, randn(rows * C, 114)), dtable({vocab, C}, d, randn(vocab * C, 115));
      REQUIRE_OK(gpu().embedding_backward(ctx(), tids.dl(), dout.dl(), dtable.dl()));
      std::vector<double> want(dtable.vals.begin(), dtable.vals.end());
      for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < C; j++) want[ids[i] * C + j] += dout.vals[i * C + j];
      const std::vector<float> first = dtable.get();
      expect_close(case_name("embedding_backward", d, {vocab, C}), first, want, tol(d));
      dtable.set(dtable.vals);
      REQUIRE_OK(gpu().embedding_backward(ctx(), tids.dl(), dout.dl(), dtable.dl()));
      CHECK(dtable.get() == first);  // deterministic

      // An id out of range fails and writes nothing.
      ids[5] = static_cast<int32_t>(vocab);
      tids.set_i32(ids);
      Gpu out({3, 100, C}, d, randn(rows * C, 116));
      host().clear_error();
      CHECK(gpu().embedding_forward(ctx(), tids.dl(), table.dl(), out.dl(), 0) == TSR_ERR_INVALID);
      CHECK_THAT(last_error(), Catch::Contains("row 5 holds id 50, outside [0, 50)"));
      CHECK(out.get() == out.vals);
      CHECK(gpu().embedding_backward(ctx(), tids.dl(), dout.dl(), dtable.dl()) == TSR_ERR_INVALID);
      CHECK(dtable.get() == first);
    }
  }
}

// Ids the loader uploaded carry the range the host saw (backend/cuda/known_ids.hpp):
// within [0, vocab) the device check is skipped; a noted range that reaches
// past vocab, or a buffer noted and then forgotten, is checked as before.
TEST_CASE("cuda embedding trusts only the id ranges the host noted", "[cuda][ops]") {
  using tessera::cuda::forget_int_range;
  using tessera::cuda::ints_known_in;
  using tessera::cuda::note_int_range;
  const int64_t vocab = 50, rows = 64, C = 16;
  Tensor tids({rows}, Dt::I32);
  std::vector<int32_t> ids(rows, 3);
  tids.set_i32(ids);
  note_int_range(tids.data, tids.bytes, 0, vocab - 1);
  CHECK(ints_known_in(tids.data, tids.bytes, vocab));
  CHECK(ints_known_in(static_cast<char *>(tids.data) + 8, 16, vocab));  // a part of it
  CHECK_FALSE(ints_known_in(tids.data, tids.bytes, vocab - 1));         // a smaller vocab
  CHECK_FALSE(ints_known_in(tids.data, tids.bytes + 4, vocab));         // past its end
  Gpu table({vocab, C}, Dt::F32, randn(vocab * C, 117));
  Gpu out({rows, C}, Dt::F32, randn(rows * C, 118));
  REQUIRE_OK(gpu().embedding_forward(ctx(), tids.dl(), table.dl(), out.dl(), 0));

  // The host saw an id of 50: the device check runs and names the row.
  ids[9] = static_cast<int32_t>(vocab);
  tids.set_i32(ids);
  note_int_range(tids.data, tids.bytes, 0, vocab);
  CHECK_FALSE(ints_known_in(tids.data, tids.bytes, vocab));
  host().clear_error();
  CHECK(gpu().embedding_forward(ctx(), tids.dl(), table.dl(), out.dl(), 0) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("row 9 holds id 50, outside [0, 50)"));

  // Forgotten (the loader refills the buffer): checked on the device again.
  note_int_range(tids.data, tids.bytes, 0, vocab - 1);
  forget_int_range(tids.data);
  CHECK_FALSE(ints_known_in(tids.data, tids.bytes, vocab));
  host().clear_error();
  CHECK(gpu().embedding_forward(ctx(), tids.dl(), table.dl(), out.dl(), 0) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("row 9 holds id 50"));
}

}  // namespace gpu_test_cuda_ops_nn
