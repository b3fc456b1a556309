// The CUDA elementwise and memory ops against the CPU ops and exact values
// (cuda_ops_support.hpp says how dtypes are compared): fill, scale, axpy,
// sum_squares, copy between host, pinned and device memory, cast between the
// float dtypes; and the routing of host-memory calls to the CPU ops.
#include <tessera/ops.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_ops_support.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_cuda_ops_elementwise {

using namespace cuda_ops_test;

// ===========================================================================
// fill, scale, axpy, sum_squares

TEST_CASE("cuda fill, scale, axpy and sum_squares", "[cuda][ops]") {
  for (Dt d : kFloatDts) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{1000003}, {3, 5}, {256, 64}}) {
      const int64_t n = numel_of(shape);
      Gpu y(shape, d, randn(n, 71));
      REQUIRE_OK(gpu().fill(ctx(), y.dl(), 1.25f));
      expect_close(case_name("fill", d, shape), y.get(), std::vector<double>(n, 1.25), 0);

      Gpu s(shape, d, randn(n, 72));
      Cpu cs(shape, s.vals);
      REQUIRE_OK(gpu().scale(ctx(), -0.3f, s.dl()));
      REQUIRE_OK(cpu().scale(ctx(), -0.3f, cs.dl()));
      expect_close(case_name("scale", d, shape), s.get(), cs.get(), tol(d));

      // axpy with x and y in this dtype, and x in this dtype into float32 y
      for (Dt yd : {d, Dt::F32}) {
        Gpu x(shape, d, randn(n, 73)), ay(shape, yd, randn(n, 74));
        Cpu cx(shape, x.vals), cy(shape, ay.vals);
        REQUIRE_OK(gpu().axpy(ctx(), 0.75f, x.dl(), ay.dl()));
        REQUIRE_OK(cpu().axpy(ctx(), 0.75f, cx.dl(), cy.dl()));
        expect_close(case_name("axpy", d, shape, std::string("into ") + name(yd)), ay.get(),
                     cy.get(), tol(yd));
      }

      Gpu q(shape, d, randn(n, 75));
      Cpu cq(shape, q.vals);
      double got = 0, got2 = 0, want = 0;
      REQUIRE_OK(gpu().sum_squares(ctx(), q.dl(), &got));
      REQUIRE_OK(cpu().sum_squares(ctx(), cq.dl(), &want));
      INFO(case_name("sum_squares", d, shape) << ": got " << got << ", want " << want);
      CHECK(std::fabs(got - want) <= 1e-10 * want);
      REQUIRE_OK(gpu().sum_squares(ctx(), q.dl(), &got2));
      CHECK(got2 == got);
    }
  }
  // An unaligned view (byte_offset of one element) takes the scalar path.
  Gpu x({17}, Dt::BF16, randn(17, 76));
  DLTensor *v = x.dl();
  int64_t sixteen = 16;
  v->shape = &sixteen;
  v->byte_offset = 2;
  double got = 0, want = 0;
  for (int i = 1; i < 17; i++) want += double(x.vals[i]) * x.vals[i];
  REQUIRE_OK(gpu().sum_squares(ctx(), v, &got));
  CHECK(std::fabs(got - want) <= 1e-12 * want);
}

// ===========================================================================
// copy and cast

TEST_CASE("cuda copy between every pair of host, pinned and device memory", "[cuda][ops]") {
  const int types[] = {kDLCPU, kDLCUDAHost, kDLCUDA};
  for (Dt d : {Dt::F32, Dt::BF16}) {
    for (int st : types) {
      for (int dt : types) {
        if (d != Dt::F32 && st != kDLCUDA && dt != kDLCUDA) continue;  // CPU ops: float32
        const std::vector<int64_t> shape{123, 7};
        const std::vector<float> v = rounded(d, randn(123 * 7, 81));
        Tensor src(shape, d, st), dst(shape, d, dt);
        src.set(v);
        INFO("copy " << src.desc() << " -> " << dst.desc());
        REQUIRE_OK(gpu().copy(ctx(), src.dl(), dst.dl()));
        // Pageable destinations are ready on return; the rest after a sync.
        if (dt != kDLCPU) tessera::cuda::synchronize();
        CHECK(dst.get() == v);
      }
    }
  }
  // Overlapping views of one device buffer: memmove semantics.
  Gpu buf({64}, Dt::F32, randn(64, 82));
  DLTensor src = *buf.dl(), dst = src;
  int64_t n = 48;
  src.shape = &n;
  dst.shape = &n;
  dst.byte_offset = 16 * sizeof(float);
  REQUIRE_OK(gpu().copy(ctx(), &src, &dst));
  std::vector<float> want = buf.vals;
  std::memmove(want.data() + 16, buf.vals.data(), 48 * sizeof(float));
  CHECK(buf.get() == want);

  Gpu a({8}, Dt::F32, randn(8, 83)), b({8}, Dt::BF16, randn(8, 83)), c({9}, Dt::F32, randn(9, 1));
  CHECK(gpu().copy(ctx(), a.dl(), b.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("differ in dtype"));
  CHECK(gpu().copy(ctx(), a.dl(), c.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(), Catch::Contains("differ in element count"));
}

TEST_CASE("cuda cast between every pair of float dtypes rounds to nearest even", "[cuda][ops]") {
  std::vector<float> v = randn(1000, 91, -70000, 70000);
  for (size_t i = 0; i < 300; i++) v[i] = v[i] * 1e-4f;  // small ones too
  v[0] = 1.0f + 1.0f / 256;                              // a bf16 tie: rounds to even (1.0)
  v[1] = 65504.0f;
  for (Dt from : kFloatDts) {
    for (Dt to : kFloatDts) {
      Gpu x({10, 100}, from, v);
      Tensor y({1000}, to);
      INFO("cast " << name(from) << " -> " << name(to));
      REQUIRE_OK(gpu().cast(ctx(), x.dl(), y.dl()));
      std::vector<float> want = x.vals;
      for (float &e : want) e = round_to(to, e);
      CHECK(y.get() == want);
    }
  }
  Gpu x({8}, Dt::F32, randn(8, 1));
  Tensor y({9}, Dt::BF16);
  CHECK(gpu().cast(ctx(), x.dl(), y.dl()) == TSR_ERR_INVALID);
}

// ===========================================================================
// Routing: host tensors go to the CPU ops; mixes are errors

TEST_CASE("cuda ops forward host-memory calls to the CPU ops", "[cuda][ops]") {
  for (int type : {kDLCPU, kDLCUDAHost}) {
    Tensor x({10}, Dt::F32, type), y({10}, Dt::F32, type);
    x.set(randn(10, 121));
    y.set(randn(10, 122));
    const std::vector<float> xv = x.get(), yv = y.get();
    REQUIRE_OK(gpu().axpy(ctx(), 2.0f, x.dl(), y.dl()));
    std::vector<double> want(10);
    for (int i = 0; i < 10; i++) want[i] = double(yv[i]) + 2.0 * xv[i];
    expect_close("axpy on host type " + std::to_string(type), y.get(), want, 1e-6);
    double ss = 0;
    REQUIRE_OK(gpu().sum_squares(ctx(), x.dl(), &ss));
    CHECK(ss > 0);
  }
  Tensor hx({10}, Dt::F32, kDLCPU);
  Gpu dy({10}, Dt::F32, randn(10, 123));
  host().clear_error();
  CHECK(gpu().axpy(ctx(), 1.0f, hx.dl(), dy.dl()) == TSR_ERR_INVALID);
  CHECK_THAT(last_error(),
             Catch::Contains("axpy: x float32[10] is on device type 1, expected CUDA"));
  DLTensor odd = *dy.dl();
  odd.device.device_type = kDLOpenCL;
  CHECK(gpu().fill(ctx(), &odd, 0.0f) == TSR_ERR_UNSUPPORTED);
  CHECK_THAT(last_error(), Catch::Contains("fill: x"));
}

}  // namespace gpu_test_cuda_ops_elementwise
