// The compute stream's own time over spans of queued work, for the
// breakdown's GPU side of an offloaded step: how long the GPU spent on a
// step's passes, and how long it sat at waits for the offloaded update.
// The host's timers measure enqueueing, which the GPU runs behind.
// Only CUDA runs have one (gpu_clock_make returns null elsewhere).
#pragma once

#include <tessera/tessera.h>

#include <memory>

namespace tessera {

class GpuClock {
 public:
  virtual ~GpuClock() = default;
  // A span starts / ends where the compute stream reaches this point.
  virtual void begin() = 0;
  virtual void end() = 0;
  // Seconds of the spans the stream has finished since the last call.
  virtual double take() = 0;
};

std::unique_ptr<GpuClock> gpu_clock_make(DLDevice device);

}  // namespace tessera
