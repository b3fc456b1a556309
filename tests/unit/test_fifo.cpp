// No reader hangs on a path that is not a regular file (issue 23, item 2):
// a FIFO in place of a config, a DeepSpeed JSON, a hostfile, a job secret, a
// checkpoint's manifest, `latest` or shard, a safetensors file, a tokenizer
// file, a run's metrics, a plugin library, an IDX file or a token shard is
// refused at once with a message naming the file and what it is; a shard
// symlinked to /dev/zero is refused by `ckpt verify` instead of being read
// until memory runs out. Each reader runs on a thread with a deadline: one
// that blocks fails the test (and is then released by opening the FIFO's
// other end), so a regression fails instead of hanging the suite.
#include <fcntl.h>
#include <sys/stat.h>
#include <tessera/dataset.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "ckpt/checkpoint.hpp"
#include "config/config.hpp"
#include "data/tokenizer_bpe.hpp"
#include "launch/hostfile.hpp"
#include "launch/job_secret.hpp"
#include "plugin/verify.hpp"
#include "support/fixture.hpp"
#include "support/hand_checkpoint.hpp"
#include "support/temp_dir.hpp"
#include "util/error.hpp"
#include "util/safetensors.hpp"
#include "viz/plot.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_fifo {

namespace {

namespace fs = std::filesystem;
using tessera::test::Fixture;
using tessera::test::TempDir;

std::string make_fifo(const TempDir &dir, const std::string &name) {
  const std::string p = dir.file(name);
  fs::create_directories(fs::path(p).parent_path());
  REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
  return p;
}

// Runs `read` (which must throw) on a thread; returns its message. A read
// still running after 5 s is a hang: the test fails, and the FIFO at
// `fifo` gets a writer that closes at once, so the reader sees its end.
std::string refusal(const std::string &fifo, const std::function<void()> &read) {
  std::promise<std::string> done;
  auto result = done.get_future();
  std::thread t([&] {
    try {
      read();
      done.set_value("(no error)");
    } catch (const std::exception &e) {
      done.set_value(e.what());
    }
  });
  if (result.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    FAIL_CHECK("the reader blocked on the FIFO " << fifo);
    for (int i = 0;
         i < 100 && result.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready;
         ++i) {
      const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (w >= 0) ::close(w);
    }
  }
  t.join();
  return result.get();
}

// What every refusal says: the path, and that it is a FIFO.
void check_names_fifo(const std::string &msg, const std::string &path) {
  INFO(msg);
  CHECK_THAT(msg, Catch::Contains(path) && Catch::Contains("is a FIFO (named pipe)") &&
                      Catch::Contains("not a regular file"));
}

std::string dataset_error(Fixture &f, const std::string &plugin, const std::string &toml) {
  const auto *vt = f.vtable<tsr_dataset_vtable>("dataset", plugin);
  REQUIRE(vt != nullptr);
  tsr_config *cfg = f.config("dataset", plugin, toml);
  void *self = nullptr;
  const tsr_status st = vt->create(f.host.table(), cfg, "train", &self);
  if (self) vt->destroy(self);
  if (st == TSR_OK) throw std::runtime_error("(no error)");
  throw std::runtime_error(f.host.last_error());
}

}  // namespace

TEST_CASE("configs, hostfiles and secrets: a FIFO is refused, naming it", "[fifo]") {
  TempDir dir("tessera_fifo");
  const std::string toml = make_fifo(dir, "run.toml");
  check_names_fifo(refusal(toml, [&] { tessera::config::Document::load(toml); }), toml);
  const std::string json = make_fifo(dir, "ds.json");
  const std::string ds = refusal(json, [&] { tessera::config::Document::load(json); });
  check_names_fifo(ds, json);
  CHECK_THAT(ds, Catch::Contains("DeepSpeed config"));
  const std::string hosts = make_fifo(dir, "hostfile");
  check_names_fifo(refusal(hosts, [&] { tessera::parse_hostfile(hosts); }), hosts);
  // The secret file keeps its own stricter rules (no symlink, mode 600).
  const std::string secret = make_fifo(dir, "secret");
  CHECK_THAT(refusal(secret, [&] { tessera::read_job_secret_file(secret); }),
             Catch::Contains(secret) && Catch::Contains("not a regular file"));
}

TEST_CASE("checkpoints: a FIFO manifest, latest or shard is refused, /dev/zero too",
          "[fifo][checkpoint]") {
  TempDir dir("tessera_fifo");
  const fs::path root = dir.path() / "ckpt", step = root / "step_00000001";
  std::vector<float> values(1024);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  tessera::test::write_hand_checkpoint(step, values);
  REQUIRE(tessera::verify_checkpoint(step.string()).empty());

  SECTION("latest") {
    const std::string latest = make_fifo(dir, "ckpt/latest");
    check_names_fifo(refusal(latest, [&] { tessera::resolve_checkpoint("auto", root.string()); }),
                     latest);
  }
  SECTION("manifest.json") {
    fs::remove(step / "manifest.json");
    const std::string m = make_fifo(dir, "ckpt/step_00000001/manifest.json");
    check_names_fifo(refusal(m, [&] { tessera::read_manifest(step.string()); }), m);
    const auto problems = tessera::verify_checkpoint(step.string());
    REQUIRE(problems.size() == 1);
    check_names_fifo(problems[0], m);
  }
  SECTION("a shard") {
    fs::remove(step / "rank_00000.safetensors");
    const std::string shard = make_fifo(dir, "ckpt/step_00000001/rank_00000.safetensors");
    std::vector<std::string> problems;
    refusal(shard, [&] {
      problems = tessera::verify_checkpoint(step.string());
      throw std::runtime_error("verified");
    });
    REQUIRE(!problems.empty());
    check_names_fifo(problems[0], shard);
    std::vector<float> params;
    check_names_fifo(
        refusal(shard, [&] { tessera::read_canonical_params(step.string(), &params, nullptr); }),
        shard);
  }
  SECTION("a shard linked to /dev/zero") {
    const fs::path shard = step / "rank_00000.safetensors";
    fs::remove(shard);
    fs::create_symlink("/dev/zero", shard);
    std::vector<std::string> problems;
    refusal(shard.string(), [&] {
      problems = tessera::verify_checkpoint(step.string());
      throw std::runtime_error("verified");
    });
    REQUIRE(!problems.empty());
    CHECK_THAT(problems[0],
               Catch::Contains(shard.string()) && Catch::Contains("is a character device"));
  }
}

TEST_CASE("safetensors, tokenizer, metrics and plugin files: a FIFO is refused", "[fifo]") {
  TempDir dir("tessera_fifo");
  const std::string st = make_fifo(dir, "w.safetensors");
  check_names_fifo(refusal(st, [&] { tessera::SafetensorsFile f(st); }), st);
  const std::string enc = make_fifo(dir, "encoder.json");
  const std::string bpe = dir.write("vocab.bpe", "#version: 0.2\n");
  check_names_fifo(refusal(enc, [&] { tessera::data::Gpt2Bpe::load(enc, bpe); }), enc);
  const std::string metrics = make_fifo(dir, "run/metrics.jsonl");
  check_names_fifo(
      refusal(metrics, [&] { tessera::viz::load_run_metrics((dir.path() / "run").string()); }),
      metrics);
  const std::string lib = make_fifo(dir, "libtsr_x.so");
  check_names_fifo(refusal(lib, [&] { tessera::elf_exported_symbols(lib); }), lib);
}

TEST_CASE("datasets: a FIFO as an IDX file or a token shard is refused", "[fifo]") {
  TempDir dir("tessera_fifo");
  Fixture f;
  const std::string images = make_fifo(dir, "images.gz");
  const std::string msg = refusal(images, [&] {
    dataset_error(f, "idx", "images = '" + images + "'\nlabels = '" + images + "'\n");
  });
  check_names_fifo(msg, images);
  CHECK_THAT(msg, Catch::Contains("idx:"));
  const std::string shard = make_fifo(dir, "tok_000000.bin");
  const std::string tmsg =
      refusal(shard, [&] { dataset_error(f, "tokens", "files = '" + shard + "'\ncontext = 2\n"); });
  check_names_fifo(tmsg, shard);
  CHECK_THAT(tmsg, Catch::Contains("tokens: shard"));
}

}  // namespace unit_test_fifo
