// Between env_probe.cpp (GPU libraries) and env_host.cpp (the rest).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/env_probe.hpp"

namespace tessera::cli {

// What the summary line needs from the probes.
struct EnvFacts {
  int gpus = 0;          // visible to the driver
  bool runtime = false;  // libcudart loads
};

// The CUDA driver, its GPUs, the runtime, cuBLASLt, NCCL and cuDNN.
void probe_cuda(std::vector<EnvItem> &out, EnvFacts &facts);

// "79.19 GiB".
std::string format_gib(uint64_t bytes);

}  // namespace tessera::cli
