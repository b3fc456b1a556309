// The SDK's vtable adapters (tessera/cpp/entries.hpp and a header per kind):
// a table's struct_size and optional entries follow what the class has
// (offload's ABI 1.2 trio, zero's reshare and clear_grads), create reports
// a NULL out_self and a failing build through the host, every entry
// refuses a NULL self, an exception becomes its status and message, and a
// value entry falls back when it fails.
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <tessera/cpp/dataset.hpp>
#include <tessera/cpp/offload.hpp>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/sampler.hpp>
#include <tessera/cpp/zero.hpp>

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_sdk_adapters {

namespace {

namespace sdk = tessera::sdk;

// A host with only the error callback, which records the last message.
struct Recorder {
  tsr_host host{};
  std::string last;
  tsr_status code = TSR_OK;
  Recorder() {
    host.struct_size = tsr_host_STRUCT_SIZE;
    host.ctx = reinterpret_cast<tsr_host_ctx *>(this);
    host.error = [](tsr_host_ctx *ctx, tsr_status c, const char *m) {
      auto *r = reinterpret_cast<Recorder *>(ctx);
      r->code = c;
      r->last = m ? m : "";
      return c;
    };
  }
};

// Offload backends: one synchronous (ABI 1.1's table), one overlapped.
struct SyncBackend {
  static constexpr const char *kName = "sync backend";
  const tsr_host *host = nullptr;
  int flushes = 0;
  void setup(const tsr_offload_setup *) {}
  void step(const tsr_offload_step *) { throw std::runtime_error("no step today"); }
  void flush() { ++flushes; }
  void read_state(uint32_t, size_t, size_t, float *) {}
  void write_state(uint32_t, size_t, size_t, const float *) {
    throw sdk::Error(TSR_ERR_IO, "sync backend: disk full");
  }
};
struct OverlappedBackend : SyncBackend {
  void wait_params(size_t, size_t) {}
  void wait_grads() {}
  void stats(tsr_offload_stats *) {}
};

// The build of a class with a `host` member and no config.
template <typename T>
std::unique_ptr<T> build_with_host(const tsr_host *host, const tsr_config *) {
  auto t = std::make_unique<T>();
  t->host = host;
  return t;
}
SyncBackend *build_failing(const tsr_host *, const tsr_config *) {
  throw sdk::Error(TSR_ERR_CONFIG, "sync backend: bad key");
}

TEST_CASE("offload_vtable: the ABI 1.2 entries and struct_size follow the class", "[sdk]") {
  constexpr tsr_offload_vtable sync =
      sdk::offload_vtable<SyncBackend, build_with_host<SyncBackend>>();
  CHECK(sync.struct_size == TSR_STRUCT_SIZE(tsr_offload_vtable, write_state));
  CHECK(sync.write_state != nullptr);
  CHECK(sync.wait_params == nullptr);
  CHECK(sync.wait_grads == nullptr);
  CHECK(sync.stats == nullptr);
  constexpr tsr_offload_vtable overlapped =
      sdk::offload_vtable<OverlappedBackend, build_with_host<OverlappedBackend>>();
  CHECK(overlapped.struct_size == tsr_offload_vtable_STRUCT_SIZE);
  CHECK(overlapped.wait_params != nullptr);
  CHECK(overlapped.wait_grads != nullptr);
  CHECK(overlapped.stats != nullptr);
}

TEST_CASE("adapters: create, a guarded call, destroy and a NULL self", "[sdk]") {
  Recorder r;
  const tsr_offload_vtable vt = sdk::offload_vtable<SyncBackend, build_with_host<SyncBackend>>();
  void *self = reinterpret_cast<void *>(1);
  REQUIRE(vt.create(&r.host, nullptr, &self) == TSR_OK);
  REQUIRE(self != nullptr);
  CHECK(vt.flush(self) == TSR_OK);
  CHECK(static_cast<SyncBackend *>(self)->flushes == 1);
  // An sdk::Error keeps its status and message; any other exception is
  // TSR_ERR_INTERNAL with its what().
  CHECK(vt.write_state(self, 0, 0, 0, nullptr) == TSR_ERR_IO);
  CHECK(r.last == "sync backend: disk full");
  CHECK(vt.step(self, nullptr) == TSR_ERR_INTERNAL);
  CHECK(r.last.find("no step today") != std::string::npos);
  vt.destroy(self);
  vt.destroy(nullptr);  // a no-op
  CHECK(vt.flush(nullptr) == TSR_ERR_INVALID);
  // create: NULL out_self, and a build that throws (out_self stays NULL).
  CHECK(vt.create(&r.host, nullptr, nullptr) == TSR_ERR_INVALID);
  CHECK(r.last == "sync backend: out_self is NULL");
  const tsr_offload_vtable failing = sdk::offload_vtable<SyncBackend, build_failing>();
  self = reinterpret_cast<void *>(1);
  CHECK(failing.create(&r.host, nullptr, &self) == TSR_ERR_CONFIG);
  CHECK(self == nullptr);
  CHECK(r.last == "sync backend: bad key");
}

// A zero stage with and without ABI 1.2's reshare and clear_grads.
struct Stage {
  static constexpr const char *kName = "stage";
  const tsr_host *host_ = nullptr;
  const tsr_host *host() const { return host_; }  // the accessor form
  double norm = 2.5;
  void plan(tsr_zero_plan *) const {}
  void setup(const tsr_zero_setup *) {}
  size_t owned_count() const { return 7; }
  void ranges(tsr_range_fn, void *) {}
  void *params(uint32_t, bool backward) { return backward ? this : nullptr; }
  void params_done(uint32_t) {}
  void *grads(uint32_t) { return this; }
  void grads_done(uint32_t, bool) {}
  void end_pass() {}
  void finish_grads() {}
  double grad_norm_sq() { return norm; }
  void step(const tsr_zero_step *) {}
};
struct Stage12 : Stage {
  void reshare() {}
  void clear_grads() {}
};
template <typename Z>
std::unique_ptr<Z> build_stage(const tsr_host *host, const tsr_config *) {
  auto z = std::make_unique<Z>();
  z->host_ = host;
  return z;
}

TEST_CASE("zero_vtable: reshare and clear_grads only where the class has them", "[sdk]") {
  constexpr tsr_zero_vtable v10 = sdk::zero_vtable<Stage, build_stage<Stage>>();
  CHECK(v10.struct_size == TSR_STRUCT_SIZE(tsr_zero_vtable, step));
  CHECK(v10.reshare == nullptr);
  CHECK(v10.clear_grads == nullptr);
  constexpr tsr_zero_vtable v12 = sdk::zero_vtable<Stage12, build_stage<Stage12>>();
  CHECK(v12.struct_size == tsr_zero_vtable_STRUCT_SIZE);
  CHECK(v12.reshare != nullptr);
  CHECK(v12.clear_grads != nullptr);

  Recorder r;
  void *self = nullptr;
  REQUIRE(v12.create(&r.host, nullptr, &self) == TSR_OK);
  CHECK(v12.owned_count(self) == 7);
  CHECK(v12.owned_count(nullptr) == 0);
  void *out = nullptr;
  CHECK(v12.params(self, 0, 1, &out) == TSR_OK);
  CHECK(out == self);
  CHECK(v12.params(self, 0, 0, &out) == TSR_OK);
  CHECK(out == nullptr);
  double norm = 0;
  CHECK(v12.grad_norm_sq(self, &norm) == TSR_OK);
  CHECK(norm == 2.5);
  CHECK(v12.grad_norm_sq(self, nullptr) == TSR_ERR_INVALID);
  CHECK(r.last == "stage: grad_norm_sq out is NULL");
  CHECK(v12.reshare(self) == TSR_OK);
  v12.destroy(self);
}

// An optimizer, a sampler and a dataset: the value entries and out checks.
struct Opt {
  static constexpr const char *kName = "opt";
  const tsr_host *host = nullptr;
  uint32_t state_count() const { return 2; }
  const char *state_name(uint32_t i) const {
    if (i > 1) throw std::out_of_range("state index");
    return i == 0 ? "m" : "v";
  }
  void step(const tsr_optimizer_step_args *) {}
};

struct Smp {
  static constexpr const char *kName = "smp";
  const tsr_host *host = nullptr;
  int64_t epoch_size(const tsr_sampler_args *) const { return 3; }
  void indices(const tsr_sampler_args *, int64_t *out) const {
    for (int64_t k = 0; k < 3; ++k) out[k] = 10 + k;
  }
};

struct Data {
  static constexpr const char *kName = "data";
  const tsr_host *host = nullptr;
  std::string split;
  void info(tsr_data_info *out) const { out->length = split == "eval" ? 5 : 50; }
  void read(const int64_t *, tsr_batch *) const {}
};
std::unique_ptr<Data> build_data(const tsr_host *host, const tsr_config *, const char *split) {
  auto d = std::make_unique<Data>();
  d->host = host;
  d->split = split;
  return d;
}

TEST_CASE("optimizer, sampler and dataset adapters", "[sdk]") {
  Recorder r;
  constexpr tsr_optimizer_vtable ov = sdk::optimizer_vtable<Opt, build_with_host<Opt>>();
  CHECK(ov.struct_size == tsr_optimizer_vtable_STRUCT_SIZE);
  void *o = nullptr;
  REQUIRE(ov.create(&r.host, nullptr, &o) == TSR_OK);
  CHECK(ov.state_count(o) == 2);
  CHECK(std::string(ov.state_name(o, 1)) == "v");
  CHECK(ov.state_name(o, 2) == nullptr);  // the exception is reported, NULL returned
  CHECK(r.code == TSR_ERR_INTERNAL);
  CHECK(ov.state_count(nullptr) == 0);
  ov.destroy(o);

  constexpr tsr_sampler_vtable sv = sdk::sampler_vtable<Smp, build_with_host<Smp>>();
  CHECK(sv.struct_size == tsr_sampler_vtable_STRUCT_SIZE);
  void *s = nullptr;
  REQUIRE(sv.create(&r.host, nullptr, &s) == TSR_OK);
  auto args = sdk::make<tsr_sampler_args>();
  int64_t n = 0, idx[3] = {};
  CHECK(sv.epoch_size(s, &args, &n) == TSR_OK);
  CHECK(n == 3);
  CHECK(sv.epoch_size(s, &args, nullptr) == TSR_ERR_INVALID);
  CHECK(r.last == "smp: out is NULL");
  CHECK(sv.indices(s, &args, idx) == TSR_OK);
  CHECK(idx[2] == 12);
  sv.destroy(s);

  constexpr tsr_dataset_vtable dv = sdk::dataset_vtable<Data, build_data>();
  CHECK(dv.struct_size == tsr_dataset_vtable_STRUCT_SIZE);
  void *d = nullptr;
  REQUIRE(dv.create(&r.host, nullptr, "eval", &d) == TSR_OK);
  auto info = sdk::make<tsr_data_info>();
  CHECK(dv.info(d, &info) == TSR_OK);
  CHECK(info.length == 5);
  CHECK(dv.read(nullptr, nullptr, nullptr) == TSR_ERR_INVALID);
  dv.destroy(d);
}

}  // namespace

}  // namespace unit_test_sdk_adapters
