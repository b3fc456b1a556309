// Integration-test harness: run the real tessera binary, give each test a
// scratch directory, write synthetic IDX data and test configs.
#pragma once

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::itest {

namespace fs = std::filesystem;

struct RunResult {
  int status = -1;  // exit code; 128 + signal when killed by one
  std::string out;  // stdout
  std::string err;  // stderr
  std::string all() const { return out + err; }
};

struct RunOptions {
  fs::path cwd;                            // empty: the test's scratch directory
  std::map<std::string, std::string> env;  // set in the child
  std::vector<std::string> unset_env;      // removed in the child (besides the defaults)
  double timeout_s = 60;                   // the child is killed after this
};

// Runs TESSERA_BINARY with `args`. The child's environment drops the
// launcher variables (RANK, WORLD_SIZE, LOCAL_RANK, ...) and
// TESSERA_PLUGIN_PATH so that every test starts from the same place.
RunResult run_cli(const std::vector<std::string> &args, const RunOptions &opts = {});

// A message for REQUIRE/INFO: the command's exit status and output.
std::string describe(const RunResult &r);

// This test's scratch directory (under the build tree), emptied on first use
// within a test case.
fs::path scratch();

std::string read_text(const fs::path &p);
void write_text(const fs::path &p, const std::string &text);
nlohmann::json read_json(const fs::path &p);
// One JSON object per line; throws on a line that is not one.
std::vector<nlohmann::json> read_jsonl(const fs::path &p);

// Synthetic 8x8 images, 4 classes: each class lights a different band of
// the image (top rows, bottom rows, left columns, right columns) over
// low-level noise from a fixed-seed generator.
struct Dataset {
  fs::path train_images, train_labels, eval_images, eval_labels;
};
// Writes 512 train and 256 eval samples under `dir`; the train images are
// gzip-compressed (exercising the gzip path), the rest plain.
Dataset write_dataset(const fs::path &dir);

// A complete test config (TOML text) training an MLP on `data` with its
// run directory at `run_dir`. `extra` is appended verbatim.
std::string config_text(const Dataset &data, const fs::path &run_dir,
                        const std::string &extra = "");

// Writes data + config under scratch(); returns the config path. The run
// directory is scratch()/"run" unless given.
struct Setup {
  Dataset data;
  fs::path config;
  fs::path run_dir;
};
Setup setup(const std::string &extra = "", const std::string &name = "run");

// The loss of every train line of a metrics.jsonl, in order.
std::vector<double> train_losses(const std::vector<nlohmann::json> &metrics);

// Lines of `text`.
std::vector<std::string> lines(const std::string &text);

// Directory entries of `dir` whose name starts with `prefix`, sorted.
std::vector<std::string> entries(const fs::path &dir, const std::string &prefix);

}  // namespace tessera::itest
