#include "debug/fault.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tessera {

void maybe_crash(uint32_t rank, int64_t step, FaultPoint at) {
  static const char *spec = std::getenv("TESSERA_TEST_CRASH");
  if (!spec) return;
  const char *attempt = std::getenv("TESSERA_ATTEMPT");
  if (attempt && std::string(attempt) != "0") return;
  long r = -1, s = -1;
  std::string where = "step";
  std::string text = spec;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item.rfind("rank=", 0) == 0) r = std::strtol(item.c_str() + 5, nullptr, 10);
    if (item.rfind("step=", 0) == 0) s = std::strtol(item.c_str() + 5, nullptr, 10);
    if (item.rfind("at=", 0) == 0) where = item.substr(3);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  bool here = (where == "save") == (at == FaultPoint::shard_written);
  if (static_cast<long>(rank) == r && step == s && here) {
    std::fprintf(stderr, "tessera: TESSERA_TEST_CRASH: killing rank %u at step %lld (%s)\n", rank,
                 static_cast<long long>(step), where.c_str());
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
  }
}

}  // namespace tessera
