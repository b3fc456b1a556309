// What a run keeps in its directories (issue 23, items 4 and 5):
// metrics.jsonl keeps its history across resumes, a failed write warns once,
// is counted and never tears a line; a directory that cannot be used is
// found at start-up; one job per directory, the holder named, a dead
// holder's lock taken over.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/temp_dir.hpp"
#include "train/metrics_log.hpp"
#include "train/run_lock.hpp"
#include "util/error.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_run_files {

namespace {

namespace fs = std::filesystem;
using tessera::MetricsLog;
using tessera::RunLock;
using tessera::test::TempDir;

nlohmann::json rec(const char *type, int64_t step) {
  return {{"type", type}, {"step", step}, {"loss", 1.0 / static_cast<double>(step + 1)}};
}

// (type, step) of every line, in order; every line must parse.
std::vector<std::pair<std::string, int64_t>> lines_of(const fs::path &p) {
  std::vector<std::pair<std::string, int64_t>> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);  // throws on a torn line
    out.emplace_back(j.at("type").get<std::string>(), j.at("step").get<int64_t>());
  }
  return out;
}

std::string error_of(const std::function<void()> &fn) {
  try {
    fn();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("metrics.jsonl keeps the history before a resume and replaces what follows",
          "[run][metrics]") {
  TempDir dir("tessera_runfiles");
  const fs::path file = dir.path() / "metrics.jsonl";
  {
    MetricsLog log(dir.path().string());
    for (int64_t s : {5, 10, 15, 20}) log.append(rec("train", s));
    log.append(rec("eval", 20));
  }
  {
    // Resumed from step 10's checkpoint: 15 and 20 come again.
    MetricsLog log(dir.path().string());
    for (int64_t s : {15, 20, 25}) log.append(rec("train", s));
  }
  using L = std::vector<std::pair<std::string, int64_t>>;
  CHECK(lines_of(file) ==
        L{{"train", 5}, {"train", 10}, {"train", 15}, {"train", 20}, {"train", 25}});
  {
    // A resume that trains nothing writes nothing, and wipes nothing.
    MetricsLog log(dir.path().string());
  }
  CHECK(lines_of(file).size() == 5);
  {
    // One that writes only the final eval at step 25 keeps the train line there.
    MetricsLog log(dir.path().string());
    log.append(rec("eval", 25));
  }
  CHECK(lines_of(file).back() == std::pair<std::string, int64_t>{"eval", 25});
  CHECK(lines_of(file).size() == 6);
}

TEST_CASE("a metrics write that fails warns once, is counted, and tears no line",
          "[run][metrics]") {
  TempDir dir("tessera_runfiles");
  const fs::path file = dir.path() / "metrics.jsonl";
  MetricsLog log(dir.path().string());
  log.append(rec("train", 1));
  // Files this process writes may grow to 300 bytes: a full disk, as far as
  // this log can tell (EFBIG instead of ENOSPC; SIGXFSZ ignored meanwhile).
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto *was = std::signal(SIGXFSZ, SIG_IGN);
  // Its warning goes to stderr: caught in a file for the check.
  const fs::path err_file = dir.path() / "stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  FILE *err = std::fopen(err_file.c_str(), "w");
  ::dup2(::fileno(err), 2);
  rlimit small = old;
  small.rlim_cur = 300;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  for (int64_t s = 2; s <= 20; ++s) log.append(rec("train", s));
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(err);
  std::signal(SIGXFSZ, was);
  CHECK(log.lost() > 0);
  const auto lines = lines_of(file);  // every line whole
  CHECK(static_cast<int64_t>(lines.size()) + log.lost() == 20);
  std::ifstream in(err_file);
  std::stringstream text;
  text << in.rdbuf();
  const std::string said = text.str();
  INFO(said);
  CHECK(said.find("warning: cannot write " + file.string()) != std::string::npos);
  CHECK(said.find("warning", said.find("warning") + 1) == std::string::npos);  // once
}

TEST_CASE("a run directory under a file is refused at start-up", "[run][errors]") {
  TempDir dir("tessera_runfiles");
  std::ofstream(dir.path() / "plain") << "x";
  const std::string bad = (dir.path() / "plain" / "ckpt").string();
  CHECK_THAT(error_of([&] { RunLock({bad}, {"checkpoint.dir"}); }),
             Catch::Contains("checkpoint.dir '" + bad + "' cannot be created"));
  CHECK_THAT(error_of([&] { MetricsLog log((dir.path() / "plain").string()); }),
             Catch::Contains("run.dir") && Catch::Contains("is not writable"));
}

TEST_CASE("one job per directory: the second is refused naming the first", "[run][security]") {
  TempDir dir("tessera_runfiles");
  const std::string run = dir.file("run"), ckpt = dir.file("run/ckpt");
  {
    RunLock first({run, ckpt}, {"run.dir", "checkpoint.dir"});
    // flock(2) locks conflict between two opens even in one process.
    const std::string msg = error_of([&] { RunLock({run}, {"run.dir"}); });
    CHECK_THAT(msg, Catch::Contains("run.dir '" + run + "' is in use by another tessera job") &&
                        Catch::Contains("PID " + std::to_string(::getpid())) &&
                        Catch::Contains("host ") && Catch::Contains("started "));
    CHECK_THAT(error_of([&] {
                 RunLock({dir.file("other"), ckpt}, {"run.dir", "checkpoint.dir"});
               }),
               Catch::Contains("checkpoint.dir '" + ckpt + "' is in use"));
    // The same directory twice (checkpoint.dir = run.dir) is one lock.
  }
  CHECK_NOTHROW(RunLock({run, run}, {"run.dir", "checkpoint.dir"}));
  // A holder that dies without a word: its lock goes with it.
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      RunLock held({run}, {"run.dir"});
      ::_exit(0);  // no destructor: as a SIGKILL would leave it
    } catch (...) {
      ::_exit(1);
    }
  }
  int st = 0;
  REQUIRE(::waitpid(child, &st, 0) == child);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK_NOTHROW(RunLock({run}, {"run.dir"}));
}

}  // namespace unit_test_run_files
