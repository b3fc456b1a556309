// The zero plugins stage0..stage3: one library, four descriptors, one
// implementation (zero_state.cpp) configured by the stage number.
#include <tessera/cpp/extension.hpp>
#include <tessera/cpp/plugin.hpp>

#include "zero_state.hpp"

namespace {

using namespace tessera::sdk;
using tessera::zero::Options;
using tessera::zero::ZeroState;

struct Instance {
  const tsr_host *host;
  ZeroState state;
};

template <int Stage>
tsr_status create(const tsr_host *host, const tsr_config *cfg, void **out) {
  return guard(host, [&] {
    Config c(host, cfg);
    Options o;
    o.stage = Stage;
    o.bucket_mb = c.get_float("bucket_mb");
    o.overlap = c.get_bool("overlap_comm");
    if (Stage == 3) o.prefetch = c.get_bool("prefetch");
    *out = new Instance{host, ZeroState(host, o)};
  });
}

Instance *self_of(void *p) {
  return static_cast<Instance *>(p);
}

void destroy(void *self) {
  delete self_of(self);
}

tsr_status plan(void *self, tsr_zero_plan *out) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.plan(out); });
}
tsr_status setup(void *self, const tsr_zero_setup *s) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.setup(s); });
}
size_t owned_count(void *self) {
  return self_of(self)->state.owned_count();
}
tsr_status ranges(void *self, tsr_range_fn fn, void *ctx) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.ranges(fn, ctx); });
}
tsr_status params(void *self, uint32_t g, int32_t backward, void **out) {
  return guard(self_of(self)->host, [&] { *out = self_of(self)->state.params(g, backward != 0); });
}
tsr_status params_done(void *self, uint32_t g) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.params_done(g); });
}
tsr_status grads(void *self, uint32_t g, void **out) {
  return guard(self_of(self)->host, [&] { *out = self_of(self)->state.grads(g); });
}
tsr_status grads_done(void *self, uint32_t g, int32_t last) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.grads_done(g, last != 0); });
}
tsr_status end_pass(void *self) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.end_pass(); });
}
tsr_status finish_grads(void *self) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.finish_grads(); });
}
tsr_status grad_norm_sq(void *self, double *out) {
  return guard(self_of(self)->host, [&] { *out = self_of(self)->state.grad_norm_sq(); });
}
tsr_status step(void *self, const tsr_zero_step *st) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.step(st); });
}

tsr_status reshare(void *self) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.reshare(); });
}

tsr_status clear_grads(void *self) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.clear_grads(); });
}

tsr_status use_source(void *self, const tsr_param_source *src) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.use_source(src); });
}

// Every stage answers, so stages 0-2 refuse offloaded parameters saying why.
tsr_status use_sink(void *self, const tsr_grad_sink *sink) {
  return guard(self_of(self)->host, [&] { self_of(self)->state.use_sink(sink); });
}

const tsr_ext_zero_param_source kParamSource = {tsr_ext_zero_param_source_STRUCT_SIZE, use_source};
const tsr_ext_zero_grad_sink kGradSink = {tsr_ext_zero_grad_sink_STRUCT_SIZE, use_sink};
const Extension kExtensions[] = {{TSR_EXT_ZERO_PARAM_SOURCE, &kParamSource},
                                 {TSR_EXT_ZERO_GRAD_SINK, &kGradSink}};
const void *get_extension(const char *id) {
  return find_extension(kExtensions, id);
}

template <int Stage>
constexpr tsr_zero_vtable vtable() {
  return {tsr_zero_vtable_STRUCT_SIZE,
          create<Stage>,
          destroy,
          plan,
          setup,
          owned_count,
          ranges,
          params,
          params_done,
          grads,
          grads_done,
          end_pass,
          finish_grads,
          grad_norm_sq,
          step,
          reshare,
          clear_grads};
}
const tsr_zero_vtable kV0 = vtable<0>(), kV1 = vtable<1>(), kV2 = vtable<2>(), kV3 = vtable<3>();

const tsr_param_decl kCommon[] = {
    param_min(
        "bucket_mb", TSR_PARAM_FLOAT, "25.0",
        "gradient reduction bucket in MiB (DeepSpeed reduce_bucket_size elements x 4 bytes / 2^20)",
        0.001),
    param("overlap_comm", TSR_PARAM_BOOL, "true", "start reductions while backward still runs"),
};
const tsr_param_decl kStage3Params[] = {
    param_min(
        "bucket_mb", TSR_PARAM_FLOAT, "25.0",
        "gradient reduction bucket in MiB (DeepSpeed reduce_bucket_size elements x 4 bytes / 2^20)",
        0.001),
    param("overlap_comm", TSR_PARAM_BOOL, "true", "start reductions while backward still runs"),
    param("prefetch", TSR_PARAM_BOOL, "true",
          "gather the next group while the current one computes"),
};

constexpr uint32_t kDevices = TSR_DEVICE_CPU | TSR_DEVICE_CUDA;
const tsr_plugin_descriptor kStage0 = {
    tsr_plugin_descriptor_STRUCT_SIZE,
    TSR_KIND_ZERO,
    "stage0",
    "1.0.0",
    "no partitioning: gradients all-reduced in buckets during backward",
    kCommon,
    2,
    kDevices,
    &kV0,
    get_extension};
const tsr_plugin_descriptor kStage1 = {tsr_plugin_descriptor_STRUCT_SIZE,
                                       TSR_KIND_ZERO,
                                       "stage1",
                                       "1.0.0",
                                       "optimizer state partitioned across ranks",
                                       kCommon,
                                       2,
                                       kDevices,
                                       &kV1,
                                       get_extension};
const tsr_plugin_descriptor kStage2 = {
    tsr_plugin_descriptor_STRUCT_SIZE,
    TSR_KIND_ZERO,
    "stage2",
    "1.0.0",
    "optimizer state and gradients partitioned (reduce-scatter during backward)",
    kCommon,
    2,
    kDevices,
    &kV2,
    get_extension};
const tsr_plugin_descriptor kStage3 = {
    tsr_plugin_descriptor_STRUCT_SIZE,
    TSR_KIND_ZERO,
    "stage3",
    "1.0.0",
    "optimizer state, gradients and parameters partitioned (gathered per group on use)",
    kStage3Params,
    3,
    kDevices,
    &kV3,
    get_extension};
const tsr_plugin_descriptor *const kPlugins[] = {&kStage0, &kStage1, &kStage2, &kStage3};
const tsr_plugin_library kLibrary = {tsr_plugin_library_STRUCT_SIZE, TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                     kPlugins, 4};

}  // namespace

TSR_PLUGIN_ENTRY {
  return &kLibrary;
}
