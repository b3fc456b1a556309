// Offload "cpu": the fp32 master weights and the optimizer state of the
// elements this rank owns live in host memory (pinned in CUDA runs), and the
// optimizer step runs on the CPU: the optimizer plugin's own CPU kernel,
// called per chunk from a pool of `threads` threads created at setup.
//
// On the CPU (run.device = "cpu") the gradients and compute parameters are
// host memory already: a step updates the range in place, the optimizer
// writing the compute copy in the same pass, exactly as offload `none` does,
// only spread over the pool. In a CUDA run a range is updated in sub-groups
// of `sub_group_size` elements, pipelined over two copy streams:
//
//   copy stream d2h:  grads k+1 -> pinned
//   CPU threads:                          update k (master, state, compute copy)
//   copy stream h2d:  params k-1 -> GPU
//
// so the link carries gradients of the next sub-group and parameters of the
// previous one while the CPU updates the current one. The gradients arrive in
// the compute dtype (bf16 or fp16 are read as such by the optimizer) and the
// optimizer writes the compute copy in that dtype into a pinned buffer.
// flush() waits for the last copies.
//
// ZeRO: stages 1-3 at any world size, stage 0 on one rank. Stage 0 at more
// ranks is refused: every rank would keep (and update) a full copy of the
// state in host memory.
#include <chrono>
#include <memory>

#include "offload_common.hpp"

namespace {

using namespace tessera::offload;
using sdk::Error;

constexpr const char *kWho = "offload cpu";

#if TSR_PLUGIN_CUDA
constexpr uint32_t kDevices = TSR_DEVICE_CPU | TSR_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = TSR_DEVICE_CPU;
#endif

struct Cpu {
  const tsr_host *host = nullptr;
  int64_t threads_cfg = 0;
  size_t sub_group = 0;
  bool pin = true;

  size_t n = 0;
  const tsr_optimizer_vtable *opt = nullptr;
  void *opt_self = nullptr;
  uint32_t state_count = 0;
  bool cuda = false;
  DLDataType compute_dtype{};
  std::vector<sdk::Buffer> slots;  // [0] master weights, [1 + i] optimizer state i
  std::unique_ptr<ThreadPool> pool;

  // What it did, for the closing log line.
  uint64_t updates = 0, elements = 0;
  double update_s = 0, wait_s = 0;

#if TSR_PLUGIN_CUDA
  CopyStreams copies;
  sdk::Buffer grads_buf[2], params_buf[2];  // pinned staging, sub_group elements each
  cudaEvent_t grads_ev[2] = {}, params_ev[2] = {};
  int next = 0;  // staging buffer of the next sub-group (alternates across steps)
  ~Cpu() {
    for (int i = 0; i < 2; ++i) {
      if (grads_ev[i]) cudaEventDestroy(grads_ev[i]);
      if (params_ev[i]) cudaEventDestroy(params_ev[i]);
    }
  }
#endif

  float *slot(uint32_t i) const {
    if (i >= slots.size()) throw Error(TSR_ERR_INVALID, fmt("%s: no state slot %u", kWho, i));
    return slots[i].as<float>();
  }
  void check_range(size_t offset, size_t count) const {
    if (offset > n || count > n - offset)
      throw Error(TSR_ERR_INVALID, fmt("%s: range [%zu, %zu + %zu) is past the %zu owned elements",
                                       kWho, offset, offset, count, n));
  }
  HostUpdate update_of(const tsr_offload_step *st, size_t begin, size_t count) const {
    HostUpdate u;
    u.master = slot(0) + st->offset + begin;
    u.state_count = state_count;
    for (uint32_t i = 0; i < state_count; ++i) u.state[i] = slot(1 + i) + st->offset + begin;
    u.owned = st->offset + begin;
    u.count = count;
    u.lr = st->lr;
    u.grad_scale = st->grad_scale;
    u.step = st->step;
    u.grads_dtype = compute_dtype;
    u.out_dtype = compute_dtype;
    return u;
  }
  void run(const HostUpdate &u) {
    const auto t0 = std::chrono::steady_clock::now();
    sdk::check(run_update(*pool, opt, opt_self, u));
    update_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++updates;
    elements += u.count;
  }
};

tsr_status create(const tsr_host *host, const tsr_config *cfg, void **out) {
  return sdk::guard(host, [&] {
    sdk::Config c(host, cfg);
    auto s = std::make_unique<Cpu>();
    s->host = host;
    s->threads_cfg = c.get_int("threads");
    s->sub_group = static_cast<size_t>(c.get_int("sub_group_size"));
    s->pin = c.get_bool("pin_memory");
    *out = s.release();
  });
}

void destroy(void *self) {
  auto *s = static_cast<Cpu *>(self);
  if (!s) return;
  if (s->updates > 0) {
    const std::string msg =
        fmt("%s: %llu updates of %llu elements on %u threads, %.3f s updating (%.2f G "
            "elements/s)%s",
            kWho, static_cast<unsigned long long>(s->updates),
            static_cast<unsigned long long>(s->elements), s->pool ? s->pool->size() : 0u,
            s->update_s, s->update_s > 0 ? s->elements / s->update_s / 1e9 : 0.0,
            s->cuda ? fmt(", %.3f s waiting for copies", s->wait_s).c_str() : "");
    s->host->log(s->host->ctx, TSR_LOG_DEBUG, msg.c_str());
  }
  delete s;
}

tsr_status setup(void *self, const tsr_offload_setup *st) {
  auto *s = static_cast<Cpu *>(self);
  return sdk::guard(s->host, [&] {
    s->cuda = check_setup(s->host, st, kWho, kDevices, "in every rank's host memory");
    s->n = st->n;
    s->opt = st->optimizer;
    s->opt_self = st->optimizer_self;
    s->state_count = st->state_count;
    s->compute_dtype = st->compute_dtype;
    const bool pinned = s->cuda && s->pin;
    const DLDevice mem{pinned ? kDLCUDAHost : kDLCPU, 0};
    for (uint32_t i = 0; i < 1 + s->state_count; ++i)
      s->slots.emplace_back(s->host, mem, s->n * sizeof(float), TSR_MEM_OPTIMIZER);
    const unsigned threads =
        s->threads_cfg > 0 ? static_cast<unsigned>(s->threads_cfg) : default_threads(s->host);
    s->pool = std::make_unique<ThreadPool>(threads);

    double staging = 0;
#if TSR_PLUGIN_CUDA
    if (s->cuda) {
      s->copies.init(kWho);
      const size_t sub = std::min(s->sub_group, std::max<size_t>(s->n, 1));
      const size_t cb = dtype_bytes(s->compute_dtype);
      for (int i = 0; i < 2; ++i) {
        s->grads_buf[i] = sdk::Buffer(s->host, DLDevice{kDLCUDAHost, 0}, sub * cb, TSR_MEM_OTHER);
        s->params_buf[i] = sdk::Buffer(s->host, DLDevice{kDLCUDAHost, 0}, sub * cb, TSR_MEM_OTHER);
        s->grads_ev[i] = make_event(kWho);
        s->params_ev[i] = make_event(kWho);
      }
      staging = 4.0 * sub * cb;
    }
#endif
    std::string names;
    for (uint32_t i = 0; i < s->state_count; ++i) {
      const char *nm = s->opt->state_name(s->opt_self, i);
      names += (i ? ", " : "") + std::string(nm ? nm : "?");
    }
    const double state_bytes = 4.0 * (1 + s->state_count) * s->n;
    const uint32_t rank = s->host->run ? s->host->run->rank : 0;
    const std::string msg = fmt(
        "%s (rank %u): fp32 master weights and %u optimizer state array%s%s%s%s of %zu owned "
        "elements in %s host memory: host %.2f MiB (+ %.2f MiB staging), GPU 0 MiB, disk 0 MiB; "
        "step on the CPU on %u thread(s)%s",
        kWho, rank, s->state_count, s->state_count == 1 ? "" : "s", names.empty() ? "" : " (",
        names.c_str(), names.empty() ? "" : ")", s->n, pinned ? "pinned" : "pageable",
        mib(state_bytes), mib(staging), threads,
        s->cuda ? fmt(", pipelined in sub-groups of %zu elements", s->sub_group).c_str() : "");
    s->host->log(s->host->ctx, TSR_LOG_INFO, msg.c_str());
  });
}

#if TSR_PLUGIN_CUDA
// The CUDA pipeline over one range (see the top of the file).
void step_cuda(Cpu *s, const tsr_offload_step *st) {
  const size_t cb = dtype_bytes(s->compute_dtype);
  const size_t sub = s->grads_buf[0].bytes() / cb;
  const size_t groups = (st->count + sub - 1) / sub;
  const char *grads = static_cast<const char *>(st->grads);
  char *params = static_cast<char *>(st->params);
  s->copies.after_compute(s->host->compute_stream);
  auto len = [&](size_t k) { return std::min(sub, st->count - k * sub); };
  // Sub-group k uses staging buffers (first + k) % 2.
  const int first = s->next;
  auto buf = [&](size_t k) { return (first + static_cast<int>(k % 2)) % 2; };
  auto fetch = [&](size_t k) {
    const int b = buf(k);
    s->copies.to_host(s->grads_buf[b].get(), grads + k * sub * cb, len(k) * cb, s->grads_ev[b]);
  };
  fetch(0);
  std::vector<tsr_segment> segs;
  for (size_t k = 0; k < groups; ++k) {
    // Buffer buf(k + 1) held sub-group k - 1's gradients, updated already.
    if (k + 1 < groups) fetch(k + 1);
    const int b = buf(k);
    const auto t0 = std::chrono::steady_clock::now();
    s->copies.wait(s->grads_ev[b]);   // gradients k are here
    s->copies.wait(s->params_ev[b]);  // and sub-group k - 2's parameters have left
    s->wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    HostUpdate u = s->update_of(st, k * sub, len(k));
    slice_segments(st->segments, st->num_segments, k * sub, k * sub + len(k), segs);
    u.segments = segs.data();
    u.num_segments = segs.size();
    u.grads = s->grads_buf[b].get();
    u.params_out = s->params_buf[b].get();
    s->run(u);
    s->copies.to_device(params + k * sub * cb, s->params_buf[b].get(), len(k) * cb,
                        s->params_ev[b]);
  }
  s->next = buf(groups);
}
#endif

tsr_status step(void *self, const tsr_offload_step *st) {
  auto *s = static_cast<Cpu *>(self);
  return sdk::guard(s->host, [&] {
    s->check_range(st->offset, st->count);
    if (st->count == 0) return;
#if TSR_PLUGIN_CUDA
    if (s->cuda) return step_cuda(s, st);
#endif
    // CPU run: gradients and compute parameters are host memory; update in
    // place, the compute copy written in the same pass.
    HostUpdate u = s->update_of(st, 0, st->count);
    u.segments = st->segments;
    u.num_segments = st->num_segments;
    u.grads = st->grads;
    u.params_out = st->params;
    s->run(u);
  });
}

tsr_status flush(void *self) {
  auto *s = static_cast<Cpu *>(self);
  return sdk::guard(s->host, [&] {
#if TSR_PLUGIN_CUDA
    if (s->cuda) s->copies.finish();
#else
    (void)s;
#endif
  });
}

tsr_status read_state(void *self, uint32_t slot, size_t offset, size_t count, float *dst) {
  auto *s = static_cast<Cpu *>(self);
  return sdk::guard(s->host, [&] {
    s->check_range(offset, count);
    if (count) std::memcpy(dst, s->slot(slot) + offset, count * sizeof(float));
  });
}

tsr_status write_state(void *self, uint32_t slot, size_t offset, size_t count, const float *src) {
  auto *s = static_cast<Cpu *>(self);
  return sdk::guard(s->host, [&] {
    s->check_range(offset, count);
    if (count) std::memcpy(s->slot(slot) + offset, src, count * sizeof(float));
  });
}

const tsr_param_decl kParams[] = {
    sdk::param_min("threads", TSR_PARAM_INT, "0",
                   "threads for the CPU step; 0: the cores of this process / ranks on the machine",
                   0),
    sdk::param_min("sub_group_size", TSR_PARAM_INT, "16777216",
                   "elements per pipelined sub-group in CUDA runs (two pinned staging buffers "
                   "each way)",
                   1024),
    sdk::param("pin_memory", TSR_PARAM_BOOL, "true",
               "CUDA runs: keep master weights and state in pinned host memory"),
};

const tsr_offload_vtable kVtable = {
    sizeof(tsr_offload_vtable), create, destroy, setup, step, flush, read_state, write_state};

const tsr_plugin_descriptor kCpu = {sizeof(tsr_plugin_descriptor),
                                    TSR_KIND_OFFLOAD,
                                    "cpu",
                                    "1.0.0",
                                    "optimizer state in host memory, step on the CPU (threaded)",
                                    kParams,
                                    sizeof(kParams) / sizeof(kParams[0]),
                                    kDevices,
                                    &kVtable};
const tsr_plugin_descriptor *const kPlugins[] = {&kCpu};
const tsr_plugin_library kLibrary = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                     kPlugins, 1};

}  // namespace

TSR_PLUGIN_ENTRY {
  return &kLibrary;
}
