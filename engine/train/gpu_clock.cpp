// The compute stream's own time (gpu_clock.hpp), through CUDA events.
#include "train/gpu_clock.hpp"

#ifdef TESSERA_HAVE_CUDA
#include "backend/cuda/stream_spans.hpp"
#endif

namespace tessera {

#ifdef TESSERA_HAVE_CUDA
namespace {

class CudaClock final : public GpuClock {
 public:
  void begin() override { spans_.begin(); }
  void end() override { spans_.end(); }
  double take() override { return spans_.take(); }

 private:
  cuda::StreamSpans spans_;
};

}  // namespace
#endif

std::unique_ptr<GpuClock> gpu_clock_make(DLDevice device) {
#ifdef TESSERA_HAVE_CUDA
  if (device.device_type == kDLCUDA) return std::make_unique<CudaClock>();
#else
  (void)device;
#endif
  return nullptr;
}

}  // namespace tessera
