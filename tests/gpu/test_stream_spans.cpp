// Spans of the compute stream timed with events (backend/cuda/stream_spans):
// a span counts once the stream has passed its end, never before (take()
// does not block), and only once. The stream is held inside a span by a
// wait on the copy stream, whose host function spins until the test lets
// it go: the span's time is then the stream's own waiting, which the
// breakdown reports as the GPU idle for want of the offloaded update.
#include <atomic>
#include <catch2/catch.hpp>

#include "backend/cuda/device.hpp"
#include "backend/cuda/stream_spans.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace gpu_test_stream_spans {

using namespace tessera;

std::atomic<bool> g_go{false};

void CUDART_CB hold(void *) {
  while (!g_go.load()) {
  }
}

TEST_CASE("stream spans: counted once the stream has passed them, without blocking",
          "[gpu][device]") {
  cuda::StreamSpans spans;
  CHECK(spans.take() == 0.0);
  g_go = false;
  cudaEvent_t released = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&released, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaLaunchHostFunc(cuda::copy_stream(), hold, nullptr) == cudaSuccess);
  REQUIRE(cudaEventRecord(released, cuda::copy_stream()) == cudaSuccess);

  spans.begin();
  REQUIRE(cudaStreamWaitEvent(cuda::compute_stream(), released, 0) == cudaSuccess);
  spans.end();
  // The stream sits at the wait: the span is not over, and take() says so
  // at once rather than waiting for it.
  CHECK(spans.take() == 0.0);

  g_go = true;
  cuda::synchronize();
  const double held = spans.take();
  CHECK(held > 0.0);
  CHECK(spans.take() == 0.0);  // counted once

  cudaEventDestroy(released);
}

}  // namespace gpu_test_stream_spans
