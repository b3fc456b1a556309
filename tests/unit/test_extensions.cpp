// ABI 1.2's extension query and struct sizes, from the host's side: the
// shipped plugins answer the ids the engine asks (learning rate, initial
// weights, a dataset's sample shape) instead of the engine reading their
// config keys; an unknown id and a plugin without extensions answer NULL; a
// descriptor that predates get_extension is told apart; sdk::copy_out
// writes no byte past the caller's struct_size.
#include <tessera/extensions.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <tessera/cpp/struct_size.hpp>

#include "gpt2_support.hpp"
#include "plugin/legacy.hpp"
#include "support/fixture.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_extensions {

namespace {

using tessera::test::Fixture;
using namespace tessera::test::gpt2_support;

const tessera::PluginEntry &entry(Fixture &f, const char *kind, const char *name) {
  const tessera::PluginEntry *e = f.registry.find(kind, name);
  REQUIRE(e != nullptr);
  return *e;
}

// Creates optimizer `name` from `toml` and returns its base_lr answer.
double answered_lr(Fixture &f, const char *name, const std::string &toml) {
  const tessera::PluginEntry &e = entry(f, "optimizer", name);
  const auto *lr = e.extension<tsr_ext_optimizer_lr>(TSR_EXT_OPTIMIZER_LR);
  REQUIRE(lr != nullptr);
  REQUIRE(TSR_HAS_FIELD(lr, tsr_ext_optimizer_lr, base_lr));
  const auto *vt = static_cast<const tsr_optimizer_vtable *>(e.desc->vtable);
  void *self = nullptr;
  REQUIRE(vt->create(f.host.table(), f.config("optimizer", name, toml), &self) == TSR_OK);
  const double got = lr->base_lr(self);
  vt->destroy(self);
  return got;
}

}  // namespace

TEST_CASE("optimizers answer their configured learning rate through tessera.optimizer.lr/1",
          "[abi][extensions]") {
  Fixture f;
  CHECK(answered_lr(f, "adam", "lr = 0.125") == 0.125);
  CHECK(answered_lr(f, "adamw", "lr = 3e-4") == 3e-4);
  CHECK(answered_lr(f, "sgd", "lr = 0.5\nmomentum = 0.9") == 0.5);
  // The declared default when the config leaves lr out.
  CHECK(answered_lr(f, "sgd", "") == 0.01);
}

TEST_CASE("the tokens dataset gives its sample shape from the config, opening no file",
          "[abi][extensions]") {
  Fixture f;
  const tessera::PluginEntry &e = entry(f, "dataset", "tokens");
  const auto *ext = e.extension<tsr_ext_dataset_shape>(TSR_EXT_DATASET_SHAPE);
  REQUIRE(ext != nullptr);
  tsr_config *cfg = f.config("dataset", "tokens",
                             "files = \"/nonexistent/shard_*.bin\"\ncontext = 48\nvocab = 300\n");
  tsr_data_info info{};
  info.struct_size = tsr_data_info_STRUCT_SIZE;
  REQUIRE(ext->shape(f.host.table(), cfg, &info) == TSR_OK);
  CHECK(info.input_ndim == 1);
  CHECK(info.input_shape[0] == 48);
  CHECK(info.target_shape[0] == 48);
  CHECK(info.input_dtype.code == kDLInt);
  CHECK(info.input_dtype.bits == 32);
  CHECK(info.num_classes == 300);
  CHECK(info.struct_size == tsr_data_info_STRUCT_SIZE);
}

TEST_CASE("gpt2 names init_from's weights file through tessera.model.init-from/1",
          "[abi][extensions][gpt2]") {
  Fixture f;
  const tessera::PluginEntry &e = entry(f, "model", "gpt2");
  const auto *ext = e.extension<tsr_ext_model_init_from>(TSR_EXT_MODEL_INIT_FROM);
  REQUIRE(ext != nullptr);
  const tsr_data_info data = token_data(kT);
  {
    Model m(f);
    REQUIRE(m.create(f.config("model", "gpt2", golden_config()), data, 1) == TSR_OK);
    CHECK(ext->weights_file(m.self) == nullptr);
  }
  Model m(f);
  const std::string dir = tessera::test::data_path("gpt2_L2_C64");
  REQUIRE(m.create(f.config("model", "gpt2", "init_from = \"" + dir + "\"\n"), data, 1) == TSR_OK);
  const char *file = ext->weights_file(m.self);
  REQUIRE(file != nullptr);
  CHECK(std::string(file) == dir + "/model.safetensors");
}

TEST_CASE("an id a plugin does not offer, and a plugin with none, answer NULL",
          "[abi][extensions]") {
  Fixture f;
  CHECK(entry(f, "optimizer", "adam").extension("tessera.optimizer.lr/2") == nullptr);
  CHECK(entry(f, "optimizer", "adam").extension(TSR_EXT_MODEL_INIT_FROM) == nullptr);
  CHECK(entry(f, "model", "mlp").extension(TSR_EXT_MODEL_INIT_FROM) == nullptr);
  CHECK(entry(f, "model", "mlp").extension(TSR_EXT_MODEL_EXPORT_HF) == nullptr);
  CHECK(entry(f, "model", "gpt2").extension(TSR_EXT_MODEL_EXPORT_HF) != nullptr);
  CHECK(entry(f, "zero", "stage2").extension(TSR_EXT_OPTIMIZER_LR) == nullptr);
  CHECK_FALSE(tessera::predates_extensions(entry(f, "optimizer", "adam")));
}

TEST_CASE("a descriptor without get_extension predates 1.2: the legacy readers answer for it",
          "[abi][extensions]") {
  Fixture f;
  tsr_plugin_descriptor old = *entry(f, "optimizer", "sgd").desc;
  old.struct_size = offsetof(tsr_plugin_descriptor, get_extension);  // a 1.1 writer's size
  tessera::PluginEntry e;
  e.desc = &old;
  CHECK(tessera::predates_extensions(e));
  CHECK(e.extension(TSR_EXT_OPTIMIZER_LR) == nullptr);
  toml::table values{{"lr", 0.25}, {"init_from", "hf/dir"}, {"context", 64}, {"vocab", 256}};
  CHECK(tessera::legacy_base_lr(values) == 0.25);
  CHECK(tessera::legacy_init_from(values) == "hf/dir");
  CHECK(tessera::legacy_window_shape(values) == std::pair<int64_t, int64_t>{64, 256});
  CHECK_FALSE(tessera::legacy_window_shape(toml::table{}).has_value());
}

TEST_CASE("struct sizes end at the last field, and copy_out stays inside the caller's struct",
          "[abi][struct_size]") {
  // tsr_zero_plan ends in a 4-byte field: sizeof claims 4 bytes of padding
  // that the declared size leaves free for a later field.
  CHECK(tsr_zero_plan_STRUCT_SIZE == offsetof(tsr_zero_plan, partition_params) + sizeof(int32_t));
  CHECK(tsr_zero_plan_STRUCT_SIZE <= sizeof(tsr_zero_plan));
  CHECK(tsr_plugin_descriptor_STRUCT_SIZE ==
        offsetof(tsr_plugin_descriptor, get_extension) + sizeof(void *));
  CHECK(tessera::sdk::make<tsr_param_info>().struct_size == tsr_param_info_STRUCT_SIZE);

  // A caller of an older version: only the fields up to `ndim` exist.
  tsr_param_info src = tessera::sdk::make<tsr_param_info>();
  src.name = "w";
  src.ndim = 2;
  src.shape[0] = 3;
  src.decay = 1;
  unsigned char buf[sizeof(tsr_param_info)];
  std::memset(buf, 0xAB, sizeof buf);
  auto *out = reinterpret_cast<tsr_param_info *>(buf);
  const size_t small = offsetof(tsr_param_info, ndim) + sizeof(int32_t);
  out->struct_size = small;
  tessera::sdk::copy_out(src, out);
  CHECK(out->struct_size == small);
  CHECK(std::string(out->name) == "w");
  CHECK(out->ndim == 2);
  for (size_t i = small; i < sizeof buf; ++i) {
    INFO("byte " << i);
    REQUIRE(buf[i] == 0xAB);
  }
}

}  // namespace unit_test_extensions
