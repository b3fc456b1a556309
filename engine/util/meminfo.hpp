// The host's available memory (the smaller of MemAvailable and what a cgroup
// limit leaves, or TESSERA_HOST_MEMORY_AVAILABLE), shared with plugins
// through the SDK's header-only copy.
#pragma once

#include <tessera/cpp/meminfo.hpp>

namespace tessera {

using sdk::available_host_memory;

}  // namespace tessera
