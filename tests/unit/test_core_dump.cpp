// The launcher's note on a crashed worker's core dump, for each kind of
// kernel.core_pattern (core(5)): a plain file name in the worker's
// directory (with core_uses_pid), an absolute pattern with specifiers, a
// handler program, and no dump at all. Wait statuses are built the way
// Linux encodes them: the signal, plus 0x80 when core was dumped.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "launch/core_dump.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_core_dump {

namespace {

namespace fs = std::filesystem;
using tessera::core_dump_note;

constexpr pid_t kPid = 4242;
constexpr int kSegvDumped = SIGSEGV | 0x80;

bool has(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("tessera-core-test-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  void touch(const std::string &name) const { std::ofstream(path / name) << "core"; }
};

}  // namespace

TEST_CASE("core dump note: no note for a clean exit or a signal that dumps no core") {
  CHECK(core_dump_note(kPid, 0, "/tmp", "core", false).empty());
  CHECK(core_dump_note(kPid, 1 << 8, "/tmp", "core", false).empty());
  CHECK(core_dump_note(kPid, SIGKILL, "/tmp", "core", false).empty());
  CHECK(core_dump_note(kPid, SIGTERM, "/tmp", "core", false).empty());
}

TEST_CASE("core dump note: a plain pattern names the file in the worker's directory") {
  TempDir d;
  d.touch("core.4242");
  std::string note = core_dump_note(kPid, kSegvDumped, d.path.string(), "core", true);
  CHECK(has(note, "core dumped to " + (d.path / "core.4242").string() + "; open it with: gdb "));
  note = core_dump_note(kPid, kSegvDumped, d.path.string(), "core.%p", false);
  CHECK(has(note, "core dumped to " + (d.path / "core.4242").string()));
  note = core_dump_note(kPid, kSegvDumped, d.path.string(), "core", false);
  CHECK(has(note, "expected at " + (d.path / "core").string() + " (not found there)"));
}

TEST_CASE("core dump note: specifiers it cannot know are matched as a glob") {
  TempDir d;
  d.touch("core.tessera.4242.1700000000");
  const std::string pattern = (d.path / "core.%e.%p.%t").string();
  std::string note = core_dump_note(kPid, kSegvDumped, "/elsewhere", pattern, false);
  CHECK(has(note, "core dumped to " + (d.path / "core.tessera.4242.1700000000").string()));
}

TEST_CASE("core dump note: a handler program is named, with how to reach the core") {
  std::string note = core_dump_note(
      kPid, kSegvDumped, "/tmp", "|/usr/lib/systemd/systemd-coredump %P %u %g %s %t %c %h", false);
  CHECK(has(note, "coredumpctl gdb 4242"));
  note = core_dump_note(kPid, kSegvDumped, "/tmp", "|/usr/share/apport/apport -p%p -s%s", false);
  CHECK(has(note, "apport"));
  note = core_dump_note(kPid, kSegvDumped, "/tmp", "|/opt/collect %p", false);
  CHECK(has(note, "handler '/opt/collect'"));
}

TEST_CASE("core dump note: a crash without a core says why there is none") {
  CHECK(has(core_dump_note(kPid, SIGSEGV, "/tmp", "core", false), "no core dump"));
  CHECK(has(core_dump_note(kPid, SIGABRT, "/tmp", "core", false), "no core dump"));
}

}  // namespace unit_test_core_dump
