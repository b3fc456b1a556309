// CPU collectives through shared memory (ShmGroup, comm.shm) against Gloo
// over TCP: three ranks as threads of this process, each with its own
// store client and GlooComm, once with shm and once without. Values are
// small integers in float, so every reduction order gives the same bits
// and both transports must agree exactly with the expected result. Sizes
// cross the slot size (4 MiB at three ranks), so the chunked paths run.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/gloo_comm.hpp"
#include "comm/store.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_comm_shm {

using tessera::GlooComm;
using tessera::StoreClient;
using tessera::StoreServer;

namespace {

constexpr uint32_t kWorld = 3;

// Catch's assertions are not for other threads: the ranks record their
// first failure here and the test checks it on the main thread.
std::vector<std::string> g_failure(kWorld);
void must(uint32_t r, tsr_status s, const char *what) {
  if (s != TSR_OK && g_failure[r].empty())
    g_failure[r] = std::string(what) + " returned " + std::to_string(s);
}

template <typename T>
DLTensor tensor(std::vector<T> &v, int64_t *shape) {
  DLTensor t{};
  t.data = v.data();
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = std::is_same_v<T, float>    ? DLDataType{kDLFloat, 32, 1}
            : std::is_same_v<T, double> ? DLDataType{kDLFloat, 64, 1}
                                        : DLDataType{kDLInt, 64, 1};
  *shape = static_cast<int64_t>(v.size());
  t.shape = shape;
  return t;
}

// Runs body(rank, comm) on kWorld threads, each a rank with its own
// communicator; returns each rank's transport line.
std::vector<std::string> run_ranks(bool shm, const std::string &prefix,
                                   const std::function<void(uint32_t, GlooComm &)> &body) {
  StoreServer server("127.0.0.1", 0);
  std::vector<std::string> transport(kWorld);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < kWorld; r++)
    threads.emplace_back([&, r] {
      StoreClient client("127.0.0.1", server.port(), std::chrono::seconds(30));
      GlooComm c(client, r, kWorld, std::chrono::seconds(30), "", "127.0.0.1", prefix, shm);
      transport[r] = c.transport();
      body(r, c);
      must(r, c.barrier(nullptr), "barrier");
    });
  for (auto &t : threads) t.join();
  return transport;
}

// The value rank r holds at element i, and the sum over ranks.
float val(uint32_t r, size_t i) {
  return static_cast<float>((i * 7 + r * 3) % 101) - 50.0f;
}

float ordered_val(uint32_t r, size_t i) {
  const float scale[] = {1.0f, 3.0e7f, -3.0e7f};
  return scale[r % 3] + static_cast<float>(i % 97) * 0.0137f * static_cast<float>(r + 1);
}

struct Results {
  std::vector<std::vector<float>> sum, avg, max, min, scattered, gathered, bcast, ordered;
  std::vector<std::vector<double>> sum64;
  std::vector<std::vector<int64_t>> isum;
};

Results exercise(bool shm, const std::string &prefix, std::vector<std::string> *transport) {
  Results res;
  for (auto *v : {&res.sum, &res.avg, &res.max, &res.min, &res.scattered, &res.gathered, &res.bcast,
                  &res.ordered})
    v->resize(kWorld);
  res.sum64.resize(kWorld);
  res.isum.resize(kWorld);
  const size_t big = (5u << 20) / 4 + 13;  // > one 4 MiB slot of floats
  *transport = run_ranks(shm, prefix, [&](uint32_t r, GlooComm &c) {
    int64_t shape = 0, shape2 = 0;
    auto fill = [&](size_t n) {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; i++) v[i] = val(r, i);
      return v;
    };
    // all_reduce, each op, asynchronously: several in flight at once.
    std::vector<float> s = fill(big), a = fill(1001), mx = fill(77), mn = fill(1);
    DLTensor ts = tensor(s, &shape), ta = tensor(a, &shape2);
    int64_t sh3 = 0, sh4 = 0;
    DLTensor tmx = tensor(mx, &sh3), tmn = tensor(mn, &sh4);
    tsr_comm_work *w1 = nullptr, *w2 = nullptr;
    must(r, c.all_reduce(nullptr, &ts, TSR_REDUCE_SUM, &w1), "all_reduce");
    must(r, c.all_reduce(nullptr, &ta, TSR_REDUCE_AVG, &w2), "all_reduce");
    must(r, c.all_reduce(nullptr, &tmx, TSR_REDUCE_MAX, nullptr), "all_reduce");
    must(r, c.all_reduce(nullptr, &tmn, TSR_REDUCE_MIN, nullptr), "all_reduce");
    must(r, c.wait(nullptr, w1), "wait");
    must(r, c.wait(nullptr, w2), "wait");
    res.sum[r] = s;
    res.avg[r] = a;
    res.max[r] = mx;
    res.min[r] = mn;
    std::vector<double> d(300);
    for (size_t i = 0; i < d.size(); i++) d[i] = val(r, i) * 0.5;
    int64_t shd = 0;
    DLTensor td = tensor(d, &shd);
    must(r, c.all_reduce(nullptr, &td, TSR_REDUCE_SUM, nullptr), "all_reduce");
    res.sum64[r] = d;
    // Fractions of very different sizes, whose float sum depends on the
    // order it is taken in: shared memory adds in rank order.
    std::vector<float> o(3000);
    for (size_t i = 0; i < o.size(); i++) o[i] = ordered_val(r, i);
    int64_t sho = 0;
    DLTensor to = tensor(o, &sho);
    must(r, c.all_reduce(nullptr, &to, TSR_REDUCE_SUM, nullptr), "all_reduce");
    res.ordered[r] = o;
    std::vector<int64_t> iv(50);
    for (size_t i = 0; i < iv.size(); i++) iv[i] = static_cast<int64_t>(i) * (r + 1);
    int64_t shi = 0;
    DLTensor ti = tensor(iv, &shi);
    must(r, c.all_reduce(nullptr, &ti, TSR_REDUCE_SUM, nullptr), "all_reduce");
    res.isum[r] = iv;
    // reduce_scatter of world x n, n past a slot's share.
    const size_t n = (2u << 20) / 4 + 5;
    std::vector<float> in = fill(kWorld * n), out(n);
    int64_t shin = 0, shout = 0;
    DLTensor tin = tensor(in, &shin), tout = tensor(out, &shout);
    must(r, c.reduce_scatter(nullptr, &tin, &tout, TSR_REDUCE_SUM, nullptr), "reduce_scatter");
    res.scattered[r] = out;
    // all_gather of more than a slot per rank.
    std::vector<float> g = fill(big), all(kWorld * big);
    int64_t shg = 0, shall = 0;
    DLTensor tg = tensor(g, &shg), tall = tensor(all, &shall);
    must(r, c.all_gather(nullptr, &tg, &tall, nullptr), "all_gather");
    res.gathered[r] = all;
    // broadcast from rank 1.
    std::vector<float> b = fill(big);
    int64_t shb = 0;
    DLTensor tb = tensor(b, &shb);
    must(r, c.broadcast(nullptr, &tb, 1, nullptr), "broadcast");
    res.bcast[r] = b;
  });
  return res;
}

}  // namespace

TEST_CASE("shared-memory collectives equal Gloo's and the expected values, at three ranks",
          "[comm][shm]") {
  std::vector<std::string> shm_transport, tcp_transport;
  for (auto &f : g_failure) f.clear();
  const Results shm = exercise(true, "test/shm", &shm_transport);
  const Results tcp = exercise(false, "test/tcp", &tcp_transport);
  for (uint32_t r = 0; r < kWorld; r++) {
    INFO("rank " << r);
    CHECK(g_failure[r].empty());
    CHECK(shm_transport[r].rfind("shared memory", 0) == 0);
    CHECK(tcp_transport[r].rfind("Gloo TCP", 0) == 0);
  }
  // Expected values.
  const size_t big = shm.sum[0].size();
  bool sum_ok = true, avg_ok = true, mx_ok = true, bc_ok = true, ag_ok = true;
  for (size_t i = 0; i < big; i++) {
    float e = 0;
    for (uint32_t q = 0; q < kWorld; q++) e += val(q, i);
    sum_ok &= shm.sum[0][i] == e && shm.sum[2][i] == e;
    bc_ok &= shm.bcast[0][i] == val(1, i) && shm.bcast[2][i] == val(1, i);
    for (uint32_t q = 0; q < kWorld; q++) ag_ok &= shm.gathered[1][q * big + i] == val(q, i);
  }
  for (size_t i = 0; i < shm.avg[0].size(); i++) {
    double e = 0;
    for (uint32_t q = 0; q < kWorld; q++) e += val(q, i);
    avg_ok &= shm.avg[1][i] == static_cast<float>(e * (1.0 / kWorld));
  }
  for (size_t i = 0; i < shm.max[0].size(); i++) {
    float m = val(0, i), n = val(0, i);
    for (uint32_t q = 1; q < kWorld; q++) m = std::max(m, val(q, i)), n = std::min(n, val(q, i));
    mx_ok &= shm.max[2][i] == m;
  }
  CHECK(sum_ok);
  CHECK(avg_ok);
  CHECK(mx_ok);
  CHECK(bc_ok);
  CHECK(ag_ok);
  CHECK(shm.min[0] == std::vector<float>{-50.0f});  // val(r, 0) = 3r - 50: min at rank 0
  CHECK(shm.isum[1][7] == 7 * (1 + 2 + 3));
  const size_t n = shm.scattered[0].size();
  bool rs_ok = true;
  for (uint32_t r = 0; r < kWorld; r++)
    for (size_t i = 0; i < n; i++) {
      float e = 0;
      for (uint32_t q = 0; q < kWorld; q++) e += val(q, r * n + i);
      rs_ok &= shm.scattered[r][i] == e;
    }
  CHECK(rs_ok);
  if (shm_transport[0].rfind("shared memory", 0) == 0) {
    bool ord_ok = true;
    for (size_t i = 0; i < shm.ordered[0].size(); i++) {
      float e = ordered_val(0, i);
      for (uint32_t q = 1; q < kWorld; q++) e += ordered_val(q, i);
      for (uint32_t r = 0; r < kWorld; r++) ord_ok &= shm.ordered[r][i] == e;
    }
    CHECK(ord_ok);
  }
  // And the two transports agree everywhere, bit for bit.
  CHECK(shm.sum == tcp.sum);
  CHECK(shm.avg == tcp.avg);
  CHECK(shm.max == tcp.max);
  CHECK(shm.sum64 == tcp.sum64);
  CHECK(shm.isum == tcp.isum);
  CHECK(shm.scattered == tcp.scattered);
  CHECK(shm.gathered == tcp.gathered);
  CHECK(shm.bcast == tcp.bcast);
}

}  // namespace unit_test_comm_shm
