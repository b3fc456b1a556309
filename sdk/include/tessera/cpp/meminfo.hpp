// How much memory this host can still give: what host buffers are checked
// against before they are made, as a GPU run's are against
// run.max_gpu_memory. Header-only, for the engine and for plugins (the
// offload backends check their state before allocating it).
//
// The figure is the smaller of MemAvailable (/proc/meminfo) and what the
// process's memory cgroup still allows: a job in a container is OOM-killed
// at its cgroup's limit, which may be far below the machine's free memory
// that MemAvailable reports. TESSERA_HOST_MEMORY_AVAILABLE replaces both,
// for limits the engine cannot see (and for tests).
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tessera/cpp/error.hpp>
#include <utility>

namespace tessera::sdk {

inline constexpr const char *kHostMemoryVar = "TESSERA_HOST_MEMORY_AVAILABLE";

struct HostMemory {
  uint64_t bytes = 0;  // 0: nothing could be read (then nothing is checked)
  std::string source;  // where the figure comes from, for messages
};

// "1.50 GiB", "12.00 MiB", "3.50 KiB", "512 bytes": sizes in messages, readable at
// any scale (a tiny test limit must not print as "0.00 GiB").
inline std::string format_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1073741824.0)
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  else if (bytes >= 1048576.0)
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  else if (bytes >= 1024.0)
    std::snprintf(buf, sizeof buf, "%.2f KiB", bytes / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.0f bytes", bytes);
  return buf;
}

// A size as run.max_gpu_memory takes it ("64GiB", "512 MiB", "500MB", a
// byte count), here so that plugins and the engine's config parser read
// sizes alike. False for anything else, zero, or more than 2^64 bytes.
inline bool parse_size(const std::string &text, uint64_t *bytes) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  const std::string num = text.substr(0, i);
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  if (num.empty() || num.find('.') != num.rfind('.') || num == ".") return false;
  char *end = nullptr;
  const double v = std::strtod(num.c_str(), &end);
  if (!end || *end != 0) return false;
  static const std::pair<const char *, double> units[] = {{"", 1},
                                                          {"B", 1},
                                                          {"KB", 1e3},
                                                          {"MB", 1e6},
                                                          {"GB", 1e9},
                                                          {"TB", 1e12},
                                                          {"KiB", 1024.0},
                                                          {"MiB", 1048576.0},
                                                          {"GiB", 1073741824.0},
                                                          {"TiB", 1099511627776.0}};
  for (const auto &[name, mult] : units) {
    if (unit != name) continue;
    const double b = std::floor(v * mult);
    if (!(b >= 1) || b >= 18446744073709551616.0) return false;
    *bytes = static_cast<uint64_t>(b);
    return true;
  }
  return false;
}

namespace meminfo_detail {

// The whole of a small file (procfs, cgroupfs); false when it cannot be
// opened.
inline bool read_small(const std::string &path, std::string *out) {
  std::FILE *f = std::fopen(path.c_str(), "re");
  if (!f) return false;
  out->clear();
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out->append(buf, n);
  std::fclose(f);
  return true;
}

// A file holding one unsigned number (memory.current, usage_in_bytes), or
// "max" (memory.max without a limit: *unlimited).
inline bool read_u64(const std::string &path, uint64_t *v, bool *unlimited) {
  std::string s;
  if (!read_small(path, &s)) return false;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  *unlimited = s == "max";
  if (*unlimited) return true;
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *v = std::strtoull(s.c_str(), nullptr, 10);
  return true;
}

// `key`'s value in a "key value" file (memory.stat); 0 when absent.
inline uint64_t stat_value(const std::string &path, const std::string &key) {
  std::string s;
  if (!read_small(path, &s)) return 0;
  for (size_t at = 0; at < s.size();) {
    size_t eol = s.find('\n', at);
    if (eol == std::string::npos) eol = s.size();
    if (s.compare(at, key.size(), key) == 0 && at + key.size() < eol && s[at + key.size()] == ' ')
      return std::strtoull(s.c_str() + at + key.size() + 1, nullptr, 10);
    at = eol + 1;
  }
  return 0;
}

}  // namespace meminfo_detail

// MemAvailable of `root`/proc/meminfo in bytes; 0 when unreadable.
inline uint64_t meminfo_available(const std::string &root = "") {
  std::FILE *f = std::fopen((root + "/proc/meminfo").c_str(), "re");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  std::fclose(f);
  return static_cast<uint64_t>(kib) * 1024;
}

// What the memory cgroup of this process still allows: limit less usage,
// at the process's cgroup and each ancestor up to the mount (a parent's
// limit binds its children too), the least of them. `limited` is false
// where no level has a limit.
struct CgroupMemory {
  bool limited = false;
  uint64_t left = 0;
  std::string where;  // the binding level, e.g. "/sys/fs/cgroup/job (memory.max)"
};

// Reads `root`/proc/self/cgroup and the cgroup files under
// `root`/sys/fs/cgroup (`root` "" for the real ones; tests pass a fake
// tree). cgroup v1's memory controller, where the hierarchy has one, else
// v2's unified hierarchy.
inline CgroupMemory cgroup_memory_left(const std::string &root = "") {
  using namespace meminfo_detail;
  CgroupMemory r;
  std::string text;
  if (!read_small(root + "/proc/self/cgroup", &text)) return r;
  // Lines "id:controllers:path"; v2's is "0::path".
  std::string v1, v2;
  bool have_v1 = false, have_v2 = false;
  for (size_t at = 0; at < text.size();) {
    size_t eol = text.find('\n', at);
    if (eol == std::string::npos) eol = text.size();
    const std::string line = text.substr(at, eol - at);
    at = eol + 1;
    const size_t c1 = line.find(':'), c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    const std::string id = line.substr(0, c1), ctl = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string path = line.substr(c2 + 1);
    if (id == "0" && ctl.empty()) {
      v2 = path;
      have_v2 = true;
    }
    for (size_t p = 0; p <= ctl.size();) {
      size_t comma = ctl.find(',', p);
      if (comma == std::string::npos) comma = ctl.size();
      if (ctl.compare(p, comma - p, "memory") == 0 && comma - p == 6) {
        v1 = path;
        have_v1 = true;
      }
      p = comma + 1;
    }
  }
  // A hybrid host mounts v2 too, but without the memory controller there.
  const bool is_v1 = have_v1;
  if (!is_v1 && !have_v2) return r;
  const std::string base = root + (is_v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup");
  const char *limit_file = is_v1 ? "memory.limit_in_bytes" : "memory.max";
  const char *usage_file = is_v1 ? "memory.usage_in_bytes" : "memory.current";
  // File pages the kernel would drop before OOM-killing (what MemAvailable
  // counts as available, and container runtimes leave out of the working
  // set): without them a job that read its data set would be refused.
  const char *reclaimable = is_v1 ? "total_inactive_file" : "inactive_file";
  // v1 writes "no limit" as the largest page-aligned signed value.
  constexpr uint64_t kV1Unlimited = uint64_t{1} << 62;
  // From the process's cgroup up to the mount. Inside a container without
  // its own cgroup namespace the path names the host's hierarchy, absent
  // here: those levels are skipped and the mount (the container's cgroup)
  // is still read.
  std::string rel = is_v1 ? v1 : v2;
  while (rel.size() > 1 && rel.back() == '/') rel.pop_back();
  for (;;) {
    const std::string dir = base + (rel == "/" ? "" : rel);
    uint64_t limit = 0, usage = 0;
    bool unlimited = false, no = false;
    if (read_u64(dir + "/" + limit_file, &limit, &unlimited) && !unlimited &&
        !(is_v1 && limit >= kV1Unlimited) && read_u64(dir + "/" + usage_file, &usage, &no) && !no) {
      const uint64_t free_pages = stat_value(dir + "/memory.stat", reclaimable);
      const uint64_t used = usage - std::min(usage, free_pages);
      const uint64_t left = limit > used ? limit - used : 0;
      if (!r.limited || left < r.left) {
        r.limited = true;
        r.left = left;
        r.where = dir.substr(root.size()) + "/" + limit_file + " less " + usage_file;
      }
    }
    if (rel.empty() || rel == "/") break;
    const size_t slash = rel.rfind('/');
    rel = slash == std::string::npos || slash == 0 ? "/" : rel.substr(0, slash);
  }
  return r;
}

// The measured figure under `root`: MemAvailable, or the cgroup's limit
// left where that is smaller. A cgroup at its limit gives 1 byte, not 0
// ("unknown"), so that everything is refused rather than nothing checked.
inline HostMemory measure_host_memory(const std::string &root = "") {
  HostMemory m;
  m.bytes = meminfo_available(root);
  if (m.bytes > 0) m.source = "MemAvailable in /proc/meminfo";
  const CgroupMemory c = cgroup_memory_left(root);
  if (c.limited && (m.bytes == 0 || c.left < m.bytes)) {
    m.bytes = std::max<uint64_t>(c.left, 1);
    m.source = "the cgroup's memory limit left: " + c.where;
  }
  return m;
}

// TESSERA_HOST_MEMORY_AVAILABLE's value in bytes; a malformed one throws
// naming the variable and the value. (Set but empty counts as unset.)
inline uint64_t parse_host_memory_override(const std::string &text) {
  uint64_t v = 0;
  if (!parse_size(text, &v))
    throw Error(TSR_ERR_CONFIG,
                "environment variable " + std::string(kHostMemoryVar) + "=\"" + text +
                    "\": expected the host memory available to this machine's ranks as a "
                    "positive size such as \"64GiB\", \"512MiB\" or a byte count");
  return v;
}

// The host memory available to this machine's ranks: the override where
// set, else measured.
inline HostMemory host_memory_available() {
  if (const char *e = std::getenv(kHostMemoryVar); e && *e) {
    HostMemory m;
    m.bytes = parse_host_memory_override(e);
    m.source = std::string(kHostMemoryVar) + "=" + e;
    return m;
  }
  return measure_host_memory();
}

}  // namespace tessera::sdk
