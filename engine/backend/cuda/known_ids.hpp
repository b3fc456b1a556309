// Value ranges of int32 tensors the engine uploaded itself (the loader's
// batches), so that ops which must validate ids before using them (the
// embedding's forward and backward) can skip their device check, and the
// host synchronisation it costs, when the host already saw every value.
//
// The loader notes a device buffer's range as it enqueues the copy and
// forgets it before the buffer is refilled; work enqueued in between on the
// compute stream reads exactly those values (it waits for the copy). The
// batch a model is handed is the host's: models read it, never write it
// (docs/writing-a-model.md), which is what makes the noted range stay true.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::cuda {

// [dev, dev + bytes) now holds int32 values, all within [lo, hi].
void note_int_range(const void *dev, size_t bytes, int64_t lo, int64_t hi);
// The buffer at `dev` is about to change: its noted range no longer holds.
void forget_int_range(const void *dev);
// True when [p, p + bytes) lies inside one noted buffer whose values all
// lie in [0, limit).
bool ints_known_in(const void *p, size_t bytes, int64_t limit);

}  // namespace tessera::cuda
