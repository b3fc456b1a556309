// Collectives for a world of one process: every collective is a copy or a
// no-op. The multi-process backends (Gloo, NCCL) implement the same table.
#pragma once

#include <tessera/host.h>

namespace tessera {
const tsr_comm *local_comm();
}
