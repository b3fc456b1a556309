// Support for the config tests (test_config.cpp, test_config_errors.cpp): a
// temporary directory, a small valid training config to append to or edit,
// and load_job on it, returning the job or the ConfigError's message checked
// to name unit.toml at the right line.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "support/temp_dir.hpp"
#include "train/job.hpp"

namespace tessera::test::config_support {

namespace fs = std::filesystem;
using tessera::JobOptions;
using tessera::config::ConfigError;

using TempDir = tessera::test::TempDir;

// The message of the ConfigError `fn` throws; fails the test when it throws
// nothing.
inline std::string error_of(const std::function<void()> &fn) {
  try {
    fn();
  } catch (const ConfigError &e) {
    return e.what();
  }
  FAIL("expected a ConfigError");
  return "";
}

// 1-based line of the first line of `text` containing `needle`.
inline int line_of(const std::string &text, const std::string &needle) {
  size_t at = text.find(needle);
  REQUIRE(at != std::string::npos);
  int line = 1;
  for (size_t i = 0; i < at; ++i) line += text[i] == '\n';
  return line;
}

// A small valid training config; tests append to it or edit it.
inline const std::string kBase = R"([run]
name = "unit"
device = "cpu"
seed = 1

[batch]
micro = 8

[model]
plugin = "mlp"
hidden = [4]

[data.train]
plugin = "idx"
images = "train-images.gz"
labels = "train-labels.gz"

[optimizer]
plugin = "sgd"
lr = 0.1
)";

// `text` with the first `from` replaced by `to`.
inline std::string edit(std::string text, const std::string &from, const std::string &to) {
  size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

inline JobOptions options(const std::string &config, std::vector<std::string> sets = {}) {
  JobOptions o;
  o.config_path = config;
  o.sets = std::move(sets);
  o.plugin_paths = {TESSERA_TEST_PLUGIN_DIR};
  return o;
}

// Writes `text` as unit.toml and loads it for training on `world` ranks.
inline tessera::Job load_text(const TempDir &dir, const std::string &text,
                              std::vector<std::string> sets = {}, uint32_t world = 1) {
  return tessera::load_job(options(dir.write("unit.toml", text), std::move(sets)), world, true);
}

// The ConfigError of loading `text`, checked to name unit.toml at the line
// holding `needle` (when given).
inline std::string load_error(const TempDir &dir, const std::string &text,
                              const std::string &needle, std::vector<std::string> sets = {},
                              uint32_t world = 1) {
  std::string msg = error_of([&] { load_text(dir, text, sets, world); });
  if (!needle.empty()) {
    std::string where = dir.file("unit.toml") + ":" + std::to_string(line_of(text, needle)) + ": ";
    INFO(msg);
    CHECK(msg.rfind(where, 0) == 0);
  }
  return msg;
}

}  // namespace tessera::test::config_support
