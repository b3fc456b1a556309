// Small string and process helpers several engine sources share.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <climits>
#include <string>
#include <tessera/cpp/meminfo.hpp>

namespace tessera {

// Byte counts for people ("1.50 GiB", "12.00 MiB", "512 bytes"): the SDK's
// one formatter, which plugins use too, so every size the engine and its
// plugins print reads alike.
using sdk::format_bytes;

// s without leading and trailing white space (isspace: blanks, tabs, CR, LF).
inline std::string trim(const std::string &s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// This program's path from /proc/self/exe, or `fallback` where it cannot
// be read.
inline std::string self_exe(const std::string &fallback = "tessera") {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : fallback;
}

// Whether a waitpid() status is anything but a clean exit with code 0.
inline bool exit_failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace tessera
