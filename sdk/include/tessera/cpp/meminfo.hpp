// How much memory this host can still give (MemAvailable in /proc/meminfo):
// what host buffers are checked against before they are made, as a GPU
// run's are against run.max_gpu_memory. Header-only, for the engine and for
// plugins (the offload backends check their state before allocating it).
#pragma once

#include <cstdint>
#include <cstdio>

namespace tessera::sdk {

// Bytes, or 0 when /proc/meminfo cannot be read (then nothing is checked).
inline uint64_t available_host_memory() {
  std::FILE *f = std::fopen("/proc/meminfo", "re");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  std::fclose(f);
  return static_cast<uint64_t>(kib) * 1024;
}

}  // namespace tessera::sdk
