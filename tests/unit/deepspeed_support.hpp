// Support for the DeepSpeed JSON tests (test_deepspeed.cpp,
// test_deepspeed_mapping.cpp): a temporary copy of configs/quickstart.toml
// with DeepSpeed JSONs written beside it, loaded as the layered document or
// the validated job (or the ConfigError's message), and typed reads of the
// document's keys and warnings.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "support/temp_dir.hpp"
#include "train/job.hpp"

namespace tessera::test::deepspeed_support {

namespace fs = std::filesystem;
using tessera::JobOptions;
using tessera::config::ConfigError;
using tessera::config::Document;
using tessera::config::find;

using TempDir = tessera::test::TempDir;

inline std::string quickstart_text() {
  std::ifstream in(TESSERA_SOURCE_DIR "/configs/quickstart.toml");
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string error_of(const std::function<void()> &fn) {
  try {
    fn();
  } catch (const ConfigError &e) {
    return e.what();
  }
  FAIL("expected a ConfigError");
  return "";
}

// A temporary copy of configs/quickstart.toml and DeepSpeed JSONs beside it.
struct Quickstart {
  TempDir dir;
  std::string toml = dir.write("quickstart.toml", quickstart_text());

  std::string json(const std::string &text, const std::string &name = "ds.json") {
    return dir.write(name, text);
  }
  JobOptions options(const std::string &ds_path, std::vector<std::string> sets = {}) const {
    JobOptions o;
    o.config_path = toml;
    o.deepspeed_path = ds_path;
    o.sets = std::move(sets);
    o.plugin_paths = {TESSERA_TEST_PLUGIN_DIR};
    return o;
  }
  // The layered document (no plugin validation).
  Document doc(const std::string &json_text) {
    return tessera::load_document(options(json(json_text)));
  }
  // The quickstart alone.
  tessera::Job base(uint32_t world = 1) const {
    return tessera::load_job(options(""), world, true);
  }
  // The validated job for training on `world` ranks.
  tessera::Job job(const std::string &json_text, uint32_t world = 1) {
    return tessera::load_job(options(json(json_text)), world, true);
  }
  std::string doc_error(const std::string &json_text) {
    return error_of([&] { doc(json_text); });
  }
  std::string job_error(const std::string &json_text, uint32_t world = 1) {
    return error_of([&] { job(json_text, world); });
  }
};

inline std::string str_at(const Document &d, const std::string &key) {
  const toml::node *n = find(d.root(), key);
  INFO(key);
  REQUIRE(n != nullptr);
  REQUIRE(n->is_string());
  return n->as_string()->get();
}
inline double num_at(const Document &d, const std::string &key) {
  const toml::node *n = find(d.root(), key);
  INFO(key);
  REQUIRE(n != nullptr);
  REQUIRE((n->is_floating_point() || n->is_integer()));
  return n->value_or(0.0);
}
inline int64_t int_at(const Document &d, const std::string &key) {
  const toml::node *n = find(d.root(), key);
  INFO(key);
  REQUIRE(n != nullptr);
  REQUIRE(n->is_integer());
  return n->as_integer()->get();
}
inline bool bool_at(const Document &d, const std::string &key) {
  const toml::node *n = find(d.root(), key);
  INFO(key);
  REQUIRE(n != nullptr);
  REQUIRE(n->is_boolean());
  return n->as_boolean()->get();
}

inline bool any_warning(const Document &d, const std::string &part) {
  for (const auto &w : d.warnings())
    if (w.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace tessera::test::deepspeed_support
