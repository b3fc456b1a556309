// The host memory figure that host buffers and offload state are checked
// against (sdk/include/tessera/cpp/meminfo.hpp): MemAvailable, or the
// memory cgroup's limit left where smaller (v2 and v1, the binding level
// among the ancestors, reclaimable file pages counted as free), read from
// fake /proc and /sys/fs/cgroup trees; and TESSERA_HOST_MEMORY_AVAILABLE,
// which replaces it, with a malformed value refused naming it.
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <tessera/cpp/meminfo.hpp>

namespace unit_test_meminfo {

namespace fs = std::filesystem;
using tessera::sdk::cgroup_memory_left;
using tessera::sdk::measure_host_memory;

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

// A fresh fake root for one test case.
fs::path fake_root(const std::string &name) {
  const fs::path root =
      fs::temp_directory_path() / ("tessera-meminfo-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(root);
  fs::create_directories(root / "proc/self");
  return root;
}

void put(const fs::path &file, const std::string &text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

void meminfo(const fs::path &root, uint64_t available) {
  put(root / "proc/meminfo",
      "MemTotal:       99999999 kB\nMemFree:          1000 kB\n"
      "MemAvailable:   " +
          std::to_string(available / 1024) + " kB\nBuffers: 1 kB\n");
}

// Sets an environment variable for one scope, restoring it after.
struct EnvVar {
  std::string name, old;
  bool had = false;
  EnvVar(const char *n, const char *value) : name(n) {
    if (const char *e = std::getenv(n)) {
      had = true;
      old = e;
    }
    if (value)
      ::setenv(n, value, 1);
    else
      ::unsetenv(n);
  }
  ~EnvVar() {
    if (had)
      ::setenv(name.c_str(), old.c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

TEST_CASE("meminfo: sizes parse as run.max_gpu_memory's do, anything else is refused",
          "[meminfo]") {
  uint64_t v = 0;
  CHECK((tessera::sdk::parse_size("1MiB", &v) && v == kMiB));
  CHECK((tessera::sdk::parse_size("64GiB", &v) && v == 64 * kGiB));
  CHECK((tessera::sdk::parse_size("512 MiB", &v) && v == 512 * kMiB));
  CHECK((tessera::sdk::parse_size("1.5GiB", &v) && v == 3 * kGiB / 2));
  CHECK((tessera::sdk::parse_size("500MB", &v) && v == 500000000));
  CHECK((tessera::sdk::parse_size("123456", &v) && v == 123456));
  for (const char *bad : {"", "abc", "0", "0.1", "-1", "1 GiBs", "1e9", "1..2", ".", "GiB",
                          "99999999999TiB", "1 GiB "})
    CHECK_FALSE(tessera::sdk::parse_size(bad, &v));
}

TEST_CASE("meminfo: sizes in messages stay readable at any scale", "[meminfo]") {
  CHECK(tessera::sdk::format_bytes(512) == "512 bytes");
  CHECK(tessera::sdk::format_bytes(1536) == "1.50 KiB");
  CHECK(tessera::sdk::format_bytes(3.0 * kMiB / 2) == "1.50 MiB");
  CHECK(tessera::sdk::format_bytes(2.0 * kGiB) == "2.00 GiB");
}

TEST_CASE("meminfo: TESSERA_HOST_MEMORY_AVAILABLE replaces the measured figure", "[meminfo]") {
  {
    EnvVar e("TESSERA_HOST_MEMORY_AVAILABLE", "3MiB");
    const auto m = tessera::sdk::host_memory_available();
    CHECK(m.bytes == 3 * kMiB);
    CHECK(m.source == "TESSERA_HOST_MEMORY_AVAILABLE=3MiB");
    CHECK(tessera::sdk::host_memory_available().bytes == 3 * kMiB);
  }
  {
    EnvVar e("TESSERA_HOST_MEMORY_AVAILABLE", "lots");
    try {
      (void)tessera::sdk::host_memory_available();
      FAIL("a malformed value was taken");
    } catch (const tessera::sdk::Error &err) {
      CHECK(err.code() == TSR_ERR_CONFIG);
      CHECK_THAT(err.what(), Catch::Contains("TESSERA_HOST_MEMORY_AVAILABLE=\"lots\"") &&
                                 Catch::Contains("\"64GiB\""));
    }
  }
  {
    // Unset (or empty): measured, and on Linux something is readable.
    EnvVar e("TESSERA_HOST_MEMORY_AVAILABLE", "");
    const auto m = tessera::sdk::host_memory_available();
    CHECK(m.bytes > 0);
    CHECK_THAT(m.source, !Catch::Contains("TESSERA_HOST_MEMORY_AVAILABLE"));
  }
}

TEST_CASE("meminfo: cgroup v2, the binding ancestor's limit less its working set", "[meminfo]") {
  const fs::path root = fake_root("v2");
  meminfo(root, 8 * kGiB);
  put(root / "proc/self/cgroup", "0::/job/rank\n");
  const fs::path cg = root / "sys/fs/cgroup";
  put(cg / "cgroup.controllers", "cpu memory\n");  // the host's root: no memory.max
  put(cg / "job/memory.max", std::to_string(2 * kGiB) + "\n");
  put(cg / "job/memory.current", std::to_string(3 * kGiB / 2) + "\n");
  // A quarter GiB of inactive file pages: reclaimable, so counted as free.
  put(cg / "job/memory.stat",
      "anon 1\nfile 2\ninactive_file_x 7\ninactive_file " + std::to_string(kGiB / 4) + "\n");
  put(cg / "job/rank/memory.max", "max\n");
  put(cg / "job/rank/memory.current", std::to_string(kGiB) + "\n");
  const auto c = cgroup_memory_left(root.string());
  CHECK(c.limited);
  CHECK(c.left == 3 * kGiB / 4);
  CHECK(c.where == "/sys/fs/cgroup/job/memory.max less memory.current");
  const auto m = measure_host_memory(root.string());
  CHECK(m.bytes == 3 * kGiB / 4);
  CHECK_THAT(m.source,
             Catch::Contains("cgroup") && Catch::Contains("/sys/fs/cgroup/job/memory.max"));

  // A limit above MemAvailable: MemAvailable binds.
  put(cg / "job/memory.max", std::to_string(64 * kGiB) + "\n");
  const auto big = measure_host_memory(root.string());
  CHECK(big.bytes == 8 * kGiB);
  CHECK(big.source == "MemAvailable in /proc/meminfo");

  // No limit anywhere ("max"): MemAvailable.
  put(cg / "job/memory.max", "max\n");
  CHECK_FALSE(cgroup_memory_left(root.string()).limited);
  CHECK(measure_host_memory(root.string()).bytes == 8 * kGiB);

  // Over its limit already: 1 byte, so that everything is refused (0 would
  // mean "unknown" and check nothing).
  put(cg / "job/rank/memory.max", std::to_string(kGiB / 2) + "\n");
  const auto full = measure_host_memory(root.string());
  CHECK(full.bytes == 1);
  CHECK_THAT(full.source, Catch::Contains("/sys/fs/cgroup/job/rank/memory.max"));
  fs::remove_all(root);
}

TEST_CASE("meminfo: a container's own cgroup at the mount when the path names the host's",
          "[meminfo]") {
  // Without a cgroup namespace /proc/self/cgroup names the host's path,
  // which the container's /sys/fs/cgroup does not have.
  const fs::path root = fake_root("container");
  meminfo(root, 8 * kGiB);
  put(root / "proc/self/cgroup", "0::/system.slice/docker-abc.scope\n");
  put(root / "sys/fs/cgroup/memory.max", std::to_string(kGiB) + "\n");
  put(root / "sys/fs/cgroup/memory.current", std::to_string(kGiB / 4) + "\n");
  const auto m = measure_host_memory(root.string());
  CHECK(m.bytes == 3 * kGiB / 4);
  CHECK_THAT(m.source, Catch::Contains("/sys/fs/cgroup/memory.max less memory.current"));
  fs::remove_all(root);
}

TEST_CASE("meminfo: cgroup v1's memory controller on a hybrid host", "[meminfo]") {
  const fs::path root = fake_root("v1");
  meminfo(root, 8 * kGiB);
  put(root / "proc/self/cgroup", "9:name=systemd:/\n5:cpu,memory:/batch/x\n0::/\n");
  const fs::path mem = root / "sys/fs/cgroup/memory";
  // v1's "no limit" at the root, and a v2 mount beside it without memory files.
  put(mem / "memory.limit_in_bytes", "9223372036854771712\n");
  put(mem / "memory.usage_in_bytes", std::to_string(4 * kGiB) + "\n");
  put(mem / "batch/x/memory.limit_in_bytes", std::to_string(kGiB) + "\n");
  put(mem / "batch/x/memory.usage_in_bytes", std::to_string(kGiB / 2) + "\n");
  put(mem / "batch/x/memory.stat",
      "inactive_file 1\ntotal_inactive_file " + std::to_string(kGiB / 4) + "\n");
  put(root / "sys/fs/cgroup/memory.max", "1\n");  // not the memory hierarchy here
  const auto c = cgroup_memory_left(root.string());
  CHECK(c.limited);
  CHECK(c.left == 3 * kGiB / 4);
  CHECK(c.where ==
        "/sys/fs/cgroup/memory/batch/x/memory.limit_in_bytes less memory.usage_in_bytes");
  CHECK(measure_host_memory(root.string()).bytes == 3 * kGiB / 4);
  fs::remove_all(root);
}

TEST_CASE("meminfo: nothing readable is 0 (nothing checked), not a refusal", "[meminfo]") {
  const fs::path root = fake_root("empty");
  CHECK(measure_host_memory(root.string()).bytes == 0);
  // A malformed limit is skipped, not taken as 0.
  meminfo(root, 2 * kGiB);
  put(root / "proc/self/cgroup", "0::/\n");
  put(root / "sys/fs/cgroup/memory.max", "lots\n");
  put(root / "sys/fs/cgroup/memory.current", "1\n");
  CHECK(measure_host_memory(root.string()).bytes == 2 * kGiB);
  fs::remove_all(root);
}

}  // namespace unit_test_meminfo
