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
// A token shard in llm.c's format (256 int32 header: magic 20240520,
// version 1, count; then uint16 tokens) of `count` tokens below `vocab`
// from a fixed generator seeded by `seed` (seed 0: the counting sequence
// 0, 1, ..., vocab - 1, 0, ..., which a model can learn); creates the
// parent directory.
void write_token_shard(const fs::path &p, size_t count, uint32_t vocab, uint32_t seed);
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

// ---- Processes that run alongside the test (multi-process tests) ----------

// A tessera process started by start_cli. Its stdout and stderr go to files
// read back at any time. If it is still running when this object goes away
// (a failed REQUIRE), it is killed with SIGKILL and reaped.
struct Process {
  int pid = -1;  // pid_t
  fs::path out_path, err_path;
  double timeout_s = 60;  // wait() kills it after this many seconds from start
  double started = 0;     // steady-clock seconds
  bool reaped = false;
  RunResult result;  // after wait() or poll() saw it exit

  Process() = default;
  Process(const Process &) = delete;
  Process &operator=(const Process &) = delete;
  Process(Process &&o) noexcept;
  Process &operator=(Process &&o) = delete;
  ~Process();

  std::string out() const;  // stdout so far
  std::string err() const;  // stderr so far
  // True once it has exited (reaps it and fills `result`); never blocks.
  bool poll();
  // Waits for it to exit (SIGKILL after timeout_s from its start) and
  // returns what it printed and its status (128 + signal when killed).
  RunResult wait();
  // Seconds since it started.
  double elapsed() const;
};

// Starts TESSERA_BINARY with `args` like run_cli, without waiting. The child
// gets its own process group so signals to it reach only it.
Process start_cli(const std::vector<std::string> &args, const RunOptions &opts = {});
// The same for any program: argv[0] is its absolute path (e.g. /usr/sbin/ip,
// to run tessera inside a network namespace).
Process start_command(const std::vector<std::string> &argv, const RunOptions &opts = {});

// Waits until `text` appears in the process's stdout (or stderr when
// `in_stderr`); false if it exits first or `timeout_s` passes.
bool wait_for_text(Process &p, const std::string &text, double timeout_s, bool in_stderr = false);

// Direct children of `pid` (from /proc/PID/task/*/children).
std::vector<int> child_pids(int pid);
// True when `pid` exists and is not a zombie.
bool process_running(int pid);
// The value of variable `name` in the environment `pid` started with ("" if
// unset or unreadable).
std::string process_env(int pid, const std::string &name);
// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

// Every F32 tensor of a safetensors file (the header is JSON after an
// 8-byte little-endian length), by name; throws on other dtypes.
struct F32Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
std::map<std::string, F32Tensor> read_safetensors_f32(const fs::path &p);

// ---- Text and time ----------------------------------------------------------

bool contains(const std::string &s, const std::string &part);
bool starts_with(const std::string &s, const std::string &prefix);
// Steady-clock seconds.
double now_s();

// ---- Multi-process jobs (tessera run -n N) --------------------------------

// The launcher's own verdict: its last "tessera run: failed: " line.
std::string launcher_verdict(const std::string &err);
// Lines of `text` that worker `rank` printed (the launcher's "[rank R] ").
std::vector<std::string> rank_lines(const std::string &text, int rank);
// True when one of `ls` contains every one of `parts`.
bool any_line_has(const std::vector<std::string> &ls, const std::vector<std::string> &parts);
// The launcher's workers, by rank (RANK in their environment), once all `n`
// are there (fewer if the launcher exits or `timeout_s` passes first).
std::map<int, int> workers_of(Process &launcher, int n, double timeout_s = 30);
// Waits until the process exits or `timeout_s` passes; true if it exited.
bool exits_within(Process &p, double timeout_s);
// "rank R (pid P) " for each of `workers` still running; "" when none is.
std::string still_running(const std::map<int, int> &workers);

}  // namespace tessera::itest
