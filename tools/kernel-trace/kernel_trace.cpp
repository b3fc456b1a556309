// A CUPTI injection library that records every kernel a CUDA process runs
// (start, end, stream, name, grid as XxYxZ) and writes them at exit as
// tab-separated lines (the grid tells calls of one GEMM kernel on other
// shapes apart),
// so one tool times ours and PyTorch's kernels the same way (bench/gpt2_gpu/
// kernel_table). CUDA loads it for any process started with
//   CUDA_INJECTION64_PATH=libtsr_kernel_trace.so TSR_KERNEL_TRACE=out.tsv
// CUPTI's activity API needs no performance-counter rights (ncu does), and
// records without serialising kernels, so the timings are the run's own.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

#define KT_CHECK(call)                                                                    \
  do {                                                                                    \
    CUptiResult r_ = (call);                                                              \
    if (r_ != CUPTI_SUCCESS) {                                                            \
      const char *s_ = nullptr;                                                           \
      cuptiGetResultString(r_, &s_);                                                      \
      std::fprintf(stderr, "kernel-trace: %s failed: %s (%s:%d)\n", #call, s_ ? s_ : "?", \
                   __FILE__, __LINE__);                                                   \
      return;                                                                             \
    }                                                                                     \
  } while (0)

struct Kernel {
  uint64_t start, end;
  uint32_t stream;
  std::string name;
  int32_t grid[3];
};

std::mutex mu;
std::vector<Kernel> *kernels = new std::vector<Kernel>;  // leaked: used at exit
constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = static_cast<uint8_t *>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
  CUpti_Activity *rec = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto *k = reinterpret_cast<const CUpti_ActivityKernel10 *>(rec);
    kernels->push_back(
        {k->start, k->end, k->streamId, k->name ? k->name : "?", {k->gridX, k->gridY, k->gridZ}});
  }
  std::free(buffer);
}

void write_trace() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char *path = std::getenv("TSR_KERNEL_TRACE");
  if (!path || !*path) path = "kernel_trace.tsv";
  std::lock_guard<std::mutex> lock(mu);
  FILE *f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "kernel-trace: cannot write %s: %s\n", path, std::strerror(errno));
    return;
  }
  for (const Kernel &k : *kernels)
    std::fprintf(f, "%llu\t%llu\t%u\t%s\t%dx%dx%d\n", static_cast<unsigned long long>(k.start),
                 static_cast<unsigned long long>(k.end), k.stream, k.name.c_str(), k.grid[0],
                 k.grid[1], k.grid[2]);
  std::fclose(f);
  std::fprintf(stderr, "kernel-trace: %zu kernels written to %s\n", kernels->size(), path);
}

void start() {
  KT_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  KT_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  std::atexit(write_trace);
}

}  // namespace

// CUDA calls this once, from the first CUDA call of the process.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  start();
  return 1;
}
