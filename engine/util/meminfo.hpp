// The host's available memory (MemAvailable), shared with plugins through
// the SDK's header-only copy.
#pragma once

#include <tessera/cpp/meminfo.hpp>

namespace tessera {

using sdk::available_host_memory;

}  // namespace tessera
