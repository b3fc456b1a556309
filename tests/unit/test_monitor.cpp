// [monitor] (DeepSpeed's tensorboard / csv_monitor / wandb): the TFRecord
// framing and CRC-32C of the event files, the TOML section and the
// DeepSpeed JSON keys resolved to directories, and the refusals. The event
// file itself is read back by TensorBoard in integration/monitor_tensorboard.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "config_support.hpp"
#include "deepspeed_support.hpp"
#include "train/monitor.hpp"
#include "util/tfevents.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_monitor {

namespace cs = tessera::test::config_support;
namespace ds = tessera::test::deepspeed_support;

namespace {

uint32_t le32(const std::string &s, size_t at) {
  uint32_t v = 0;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

std::string slurp(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("CRC-32C matches the published check values", "[monitor]") {
  // RFC 3720 (iSCSI), B.4: "123456789" and 32 zero bytes.
  CHECK(tessera::crc32c("123456789", 9) == 0xE3069283u);
  const std::string zeros(32, '\0');
  CHECK(tessera::crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  // Continuing a CRC over a split buffer gives the CRC of the whole.
  CHECK(tessera::crc32c("56789", 5, tessera::crc32c("1234", 4)) == 0xE3069283u);
}

TEST_CASE("a TFRecord frames its payload with masked CRCs of length and data", "[monitor]") {
  const std::string payload = tessera::encode_scalar_event(1.5, 7, "Train/Samples/lr", 0.25f);
  const std::string r = tessera::tfrecord(payload);
  REQUIRE(r.size() == 8 + 4 + payload.size() + 4);
  uint64_t len = 0;
  std::memcpy(&len, r.data(), 8);
  CHECK(len == payload.size());
  CHECK(le32(r, 8) == tessera::masked_crc32c(r.data(), 8));
  CHECK(r.substr(12, payload.size()) == payload);
  CHECK(le32(r, 12 + payload.size()) == tessera::masked_crc32c(payload.data(), payload.size()));
  // The mask: rotate right by 15, add 0xa282ead8.
  const uint32_t c = tessera::crc32c(payload.data(), payload.size());
  CHECK(tessera::masked_crc32c(payload.data(), payload.size()) ==
        ((c >> 15) | (c << 17)) + 0xa282ead8u);
  // Event: wall_time (field 1, fixed64), step (2, varint 7), summary (5)
  // holding value (1) { tag (1), simple_value (2, fixed32) }.
  CHECK(static_cast<uint8_t>(payload[0]) == 0x09);
  CHECK(static_cast<uint8_t>(payload[9]) == 0x10);
  CHECK(static_cast<uint8_t>(payload[10]) == 7);
  CHECK(static_cast<uint8_t>(payload[11]) == 0x2a);
  CHECK(payload.find("Train/Samples/lr") != std::string::npos);
}

TEST_CASE("an event file starts with the file-version event", "[monitor]") {
  tessera::test::TempDir dir;
  std::string path;
  {
    tessera::EventFileWriter w(dir.file("tb"));
    w.add_scalar("Train/Samples/train_loss", 2.5, 3);
    path = w.path();
  }
  CHECK(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  const std::string bytes = slurp(path);
  CHECK(bytes.find("brain.Event:2") < bytes.find("Train/Samples/train_loss"));
}

TEST_CASE("[monitor] resolves each output to output_path/job_name", "[monitor][config]") {
  cs::TempDir dir;
  SECTION("defaults: the run directory, tensorboard/ and csv_monitor/") {
    auto job =
        cs::load_text(dir, cs::kBase +
                               "\n[monitor.tensorboard]\nenabled = true\n[monitor.csv_monitor]\n"
                               "enabled = true\n");
    CHECK(job.settings.monitor.tensorboard_dir == "runs/unit/tensorboard");
    CHECK(job.settings.monitor.csv_dir == "runs/unit/csv_monitor");
    CHECK_THAT(job.resolved_toml(), Catch::Contains("[monitor.tensorboard]") &&
                                        Catch::Contains("job_name = \"tensorboard\""));
  }
  SECTION("given, and off by default") {
    auto job = cs::load_text(dir, cs::kBase +
                                      "\n[monitor.tensorboard]\nenabled = true\n"
                                      "output_path = \"logs\"\njob_name = \"bert\"\n");
    CHECK(job.settings.monitor.tensorboard_dir == "logs/bert");
    CHECK(job.settings.monitor.csv_dir.empty());
  }
  SECTION("a misspelt key") {
    std::string text = cs::kBase + "\n[monitor.tensorboard]\nenabled = true\njobname = \"x\"\n";
    std::string msg = cs::load_error(dir, text, "jobname");
    CHECK_THAT(msg, Catch::Contains("unknown key 'jobname' in [monitor.tensorboard]; did you "
                                    "mean 'job_name'?"));
  }
  SECTION("wandb, enabled, is refused with what to use instead") {
    std::string text = cs::kBase + "\n[monitor.wandb]\nenabled = true\nproject = \"p\"\n";
    std::string msg = cs::load_error(dir, text, "[monitor.wandb]");
    CHECK_THAT(msg, Catch::Contains("monitor.wandb: Weights & Biases is not supported") &&
                        Catch::Contains("use monitor.tensorboard") &&
                        Catch::Contains("or set enabled = false"));
  }
  SECTION("wandb, off, is accepted") {
    auto job = cs::load_text(dir, cs::kBase + "\n[monitor.wandb]\nenabled = false\n");
    CHECK(job.settings.monitor.tensorboard_dir.empty());
  }
}

TEST_CASE("DeepSpeed's tensorboard, csv_monitor and wandb keys map onto [monitor]",
          "[monitor][deepspeed]") {
  ds::Quickstart q;
  SECTION("tensorboard with DeepSpeed's names; job_name defaults as DeepSpeed's") {
    auto job = q.job(R"({"tensorboard": {"enabled": true, "output_path": "out/ds_logs/",
                         "job_name": "train_bert"},
                         "csv_monitor": {"enabled": true, "output_path": "out/csv"}})");
    CHECK(job.settings.monitor.tensorboard_dir == "out/ds_logs/train_bert");
    CHECK(job.settings.monitor.csv_dir == "out/csv/DeepSpeedJobName");
  }
  SECTION("wandb enabled is refused, naming the JSON key") {
    std::string msg = q.job_error(R"({"wandb": {"enabled": true, "project": "p"}})");
    CHECK_THAT(msg, Catch::Contains("ds.json: wandb.enabled") &&
                        Catch::Contains("Weights & Biases is not supported"));
  }
  SECTION("a key DeepSpeed's tensorboard does not have is refused; its wandb knobs are warned") {
    // DeepSpeed's own config refuses flush_secs (its monitor configs forbid
    // unknown keys); before, tessera warned and went on.
    CHECK_THAT(q.doc_error(R"({"tensorboard": {"enabled": false, "flush_secs": 5}})"),
               Catch::Contains("'tensorboard.flush_secs' is not a DeepSpeed config key"));
    auto doc = q.doc(R"({"wandb": {"enabled": false, "project": "p"}})");
    CHECK(ds::any_warning(doc, "wandb.project is not used by tessera; ignored"));
  }
}

TEST_CASE("the CSV monitor writes DeepSpeed's file per tag with a step,value header", "[monitor]") {
  tessera::test::TempDir dir;
  tessera::config::MonitorSettings m;
  m.csv_dir = dir.file("csv");
  {
    tessera::Monitors mon(m);
    mon.train(3, 2.5, 0.1, 1000);
    mon.eval(3, 2.25, -1);
  }
  {
    tessera::Monitors resumed(m);  // a resumed run appends, without a second header
    resumed.train(6, 1.5, 0.1, 1000);
  }
  CHECK(slurp(dir.file("csv/Train_Samples_train_loss.csv")) == "step,train_loss\n3,2.5\n6,1.5\n");
  CHECK(slurp(dir.file("csv/Eval_Samples_eval_loss.csv")) == "step,eval_loss\n3,2.25\n");
  CHECK(!std::filesystem::exists(dir.file("csv/Eval_Samples_eval_accuracy.csv")));
}

}  // namespace unit_test_monitor
