// The zero plugins stage0..stage3: one library, four descriptors, one
// implementation (zero_state.cpp, zero_grads.cpp) configured by the stage number.
#include <tessera/cpp/extension.hpp>
#include <tessera/cpp/plugin.hpp>
#include <tessera/cpp/zero.hpp>

#include "zero_state.hpp"

namespace {

using namespace tessera::sdk;
using tessera::zero::Options;
using tessera::zero::ZeroState;

template <int Stage>
std::unique_ptr<ZeroState> build(const tsr_host *host, const tsr_config *cfg) {
  Config c(host, cfg);
  Options o;
  o.stage = Stage;
  o.bucket_mb = c.get_float("bucket_mb");
  o.overlap = c.get_bool("overlap_comm");
  if (Stage == 3) o.prefetch = c.get_bool("prefetch");
  return std::make_unique<ZeroState>(host, o);
}

// Every stage answers, so stages 0-2 refuse offloaded parameters saying why.
const tsr_ext_zero_param_source kParamSource = {tsr_ext_zero_param_source_STRUCT_SIZE,
                                                entries::member<ZeroState, &ZeroState::use_source>};
const tsr_ext_zero_grad_sink kGradSink = {tsr_ext_zero_grad_sink_STRUCT_SIZE,
                                          entries::member<ZeroState, &ZeroState::use_sink>};
const tsr_ext_zero_frozen kFrozen = {tsr_ext_zero_frozen_STRUCT_SIZE,
                                     entries::member<ZeroState, &ZeroState::set_frozen>,
                                     entries::member<ZeroState, &ZeroState::frozen_ranges>};
const tsr_ext_zero_final_groups kFinalGroups = {tsr_ext_zero_final_groups_STRUCT_SIZE,
                                                entries::member<ZeroState, &ZeroState::take_final>};
const Extension kExtensions[] = {{TSR_EXT_ZERO_PARAM_SOURCE, &kParamSource},
                                 {TSR_EXT_ZERO_GRAD_SINK, &kGradSink},
                                 {TSR_EXT_ZERO_FROZEN, &kFrozen},
                                 {TSR_EXT_ZERO_FINAL_GROUPS, &kFinalGroups}};
const void *get_extension(const char *id) {
  return find_extension(kExtensions, id);
}

const tsr_zero_vtable kV0 = zero_vtable<ZeroState, build<0>>();
const tsr_zero_vtable kV1 = zero_vtable<ZeroState, build<1>>();
const tsr_zero_vtable kV2 = zero_vtable<ZeroState, build<2>>();
const tsr_zero_vtable kV3 = zero_vtable<ZeroState, build<3>>();

constexpr tsr_param_decl kBucketMb = param_min(
    "bucket_mb", TSR_PARAM_FLOAT, "25.0",
    "gradient reduction bucket in MiB (DeepSpeed reduce_bucket_size elements x 4 bytes / 2^20)",
    0.001);
constexpr tsr_param_decl kOverlap =
    param("overlap_comm", TSR_PARAM_BOOL, "true", "start reductions while backward still runs");
const tsr_param_decl kCommon[] = {kBucketMb, kOverlap};
const tsr_param_decl kStage3Params[] = {
    kBucketMb, kOverlap,
    param("prefetch", TSR_PARAM_BOOL, "true",
          "gather the next group while the current one computes")};

constexpr uint32_t kDevices = TSR_DEVICE_CPU | TSR_DEVICE_CUDA;
const tsr_plugin_descriptor kStage0 =
    describe(TSR_KIND_ZERO, "stage0", "1.0.0",
             "no partitioning: gradients all-reduced in buckets during backward", kCommon, kDevices,
             &kV0, get_extension);
const tsr_plugin_descriptor kStage1 =
    describe(TSR_KIND_ZERO, "stage1", "1.0.0", "optimizer state partitioned across ranks", kCommon,
             kDevices, &kV1, get_extension);
const tsr_plugin_descriptor kStage2 =
    describe(TSR_KIND_ZERO, "stage2", "1.0.0",
             "optimizer state and gradients partitioned (reduce-scatter during backward)", kCommon,
             kDevices, &kV2, get_extension);
const tsr_plugin_descriptor kStage3 =
    describe(TSR_KIND_ZERO, "stage3", "1.0.0",
             "optimizer state, gradients and parameters partitioned (gathered per group on use)",
             kStage3Params, kDevices, &kV3, get_extension);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kStage0, &kStage1, &kStage2, &kStage3)
