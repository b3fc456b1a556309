// Fault injection for tests: TESSERA_TEST_CRASH="rank=R,step=S[,at=save]"
// kills rank R with SIGKILL when it finishes step S (or, with at=save, right
// after it has written its checkpoint shard for step S, before the commit).
// Only the first attempt of a job crashes, so a restarted job runs through.
#pragma once

#include <cstdint>

namespace tessera {

enum class FaultPoint { step_end, shard_written };

void maybe_crash(uint32_t rank, int64_t step, FaultPoint at);

}  // namespace tessera
