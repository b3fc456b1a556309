// Offload "cpu": the fp32 master weights and the optimizer state of the
// elements this rank owns live in host memory, and the optimizer step runs
// on the CPU: the optimizer plugin's own CPU kernel, per chunk, on a pool of
// `threads` threads (pinned to cores) created at setup.
//
// The step overlaps the GPU (ABI 1.2, pipeline.hpp): step() hands a range
// over and returns; a dispatcher thread updates the ranges in order while
// the gradients of later ranges still cross the link and the next forward
// already runs on the ranges that are done. In a CPU run the dispatcher
// updates in place while the main thread goes on.
//
// `ratio` keeps a share of the state on the compute device: owned elements
// [0, ratio x n) are stepped there by the optimizer's device kernel (on the
// compute stream, at once), concurrently with the host's share. "auto" picks
// the largest share that fits beside the first step's peak under
// run.max_gpu_memory (or the GPU's size). The first owned elements are the
// first layers, so the next forward starts on them while the CPU works.
//
// Host memory: the state arrays are pageable (no copy engine ever reads
// them) and first-touched in parallel at setup; in CUDA runs two pinned
// buffers of the compute dtype hold every owned element's gradient and
// updated parameter on their way across the link.
//
// `params = "cpu"` (ZeRO stage 3, DeepSpeed's offload_param) keeps the
// owned compute parameters in host memory too: the pinned upload buffer
// becomes their home (param_home.hpp), the update writes them there and
// nothing is uploaded; the zero plugin fetches a group's slice before use.
// It also takes the gradients as each bucket is reduce-scattered (the
// gradient sink), into the pinned download buffer: none stay on the GPU.
//
// With gradient clipping (or fp16 loss scaling) the step's gradient scale
// needs the global norm, which needs every gradient. The backend speculates
// (TSR_EXT_OFFLOAD_SPECULATE, pipeline.hpp, undo.hpp): ranges are stepped as
// their gradients come, each keeping its pre-step state in the undo space
// (`speculation_memory`) first, and a verdict that changes the step puts
// them back and steps them again, so the result is the unspeculated step's
// bit for bit.
//
// ZeRO: stages 1-3 at any world size, stage 0 on one rank. Stage 0 at more
// ranks is refused: every rank would keep (and update) a full copy of the
// state in host memory.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <tessera/cpp/extension.hpp>
#include <tessera/cpp/offload.hpp>

#include "device_share.hpp"
#include "param_home.hpp"
#include "pipeline.hpp"

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "optimizer state in host memory, step on the CPU (threaded, overlapped), optionally a GPU "
    "share";

using namespace tessera::offload;
using sdk::Error;

constexpr const char *kWho = "offload cpu";

#if TSR_PLUGIN_CUDA
constexpr uint32_t kDevices = TSR_DEVICE_CPU | TSR_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = TSR_DEVICE_CPU;
#endif

struct Cpu {
  static constexpr const char *kName = kWho;  // for messages
  const tsr_host *host = nullptr;
  int64_t threads_cfg = 0;
  bool pin = true, pin_threads = true;
  Ratio ratio;
  int32_t params_where = TSR_PARAMS_ON_DEVICE;  // `params`
  std::string speculation_memory;               // "auto", "0" or a size
  bool speculation_worst_case = false;
  bool speculation_adaptive = true;  // speculation = "adaptive" (else "always")
  // speculation_memory = "auto" with too little host memory at start-up for
  // every element's undo: sized at the first speculative step instead.
  bool undo_deferred = false;

  size_t n = 0;
  // The host's arrays hold owned elements [first, n); those below are the
  // GPU's (ratio "auto" decided at start-up where the host cannot hold all).
  size_t first = 0;
  const tsr_optimizer_vtable *opt = nullptr;
  void *opt_self = nullptr;
  uint32_t state_count = 0;
  bool cuda = false;
  DLDataType compute_dtype{};
  std::vector<sdk::Buffer> slots;  // [0] master weights, [1 + i] optimizer state i
  sdk::Buffer grads_pinned, params_pinned;
  sdk::Buffer params_host;  // parameter offload in a CPU run: the home
  sdk::Buffer grads_host;   // parameter offload in a CPU run: the gradient sink's
  sdk::Buffer undo;         // speculation: the pre-step values of ranges stepped ahead
  ParamHome home;           // parameter offload (declared after the buffers it reads)
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<HostPipeline> pipeline;
  DeviceShare share;
  int64_t first_step = -1;  // the step of the first update (ratio "auto" decides after it)

  float *slot(uint32_t i) const {
    if (i >= slots.size()) throw Error(TSR_ERR_INVALID, fmt("%s: no state slot %u", kWho, i));
    return slots[i].as<float>();
  }
  void check_range(size_t offset, size_t count) const { check_owned_range(kWho, offset, count, n); }
  // The gradient sink (GradsExtension), through the pipeline: it waits for
  // the updates still reading the gradients a put replaces.
  uint64_t sink_put(size_t offset, size_t count, const void *src, bool add) {
    return pipeline->sink_put(offset, count, src, add);
  }
  void sink_release(uint64_t ticket) { pipeline->sink_release(ticket); }
  double sink_norm_sq() { return pipeline->sink_norm_sq(); }
  // Speculation (SpeculateExtension below).
  // The device share defers its steps to the verdict (device_share.hpp);
  // the host's are stepped ahead and undone where the verdict says
  // (pipeline.hpp).
  void spec_begin(uint32_t flags) {
    if (undo_deferred) size_undo_late();
    pipeline->spec_begin((flags & TSR_SPECULATE_MAY_SKIP) != 0);
    share.defer();
  }
  void spec_resolve(int32_t verdict, double grad_scale) {
    pipeline->spec_resolve(verdict, grad_scale);
    share.resolve(verdict, grad_scale);
  }

  void size_undo_late();

  // The vtable's entries (sdk::offload_vtable): the short ones here.
  ~Cpu();
  void setup(const tsr_offload_setup *st);
  void step(const tsr_offload_step *st);
  void read_state(uint32_t i, size_t offset, size_t count, float *dst);
  void write_state(uint32_t i, size_t offset, size_t count, const float *src);
  void flush() {
    pipeline->flush();
    share.flush();
  }
  // The device share is stepped on the compute stream: ordered already.
  void wait_params(size_t offset, size_t count) { pipeline->wait_params(offset, count); }
  void wait_grads() { pipeline->wait_grads(); }
  void stats(tsr_offload_stats *out) {
    if (!out || out->struct_size < TSR_STRUCT_SIZE(tsr_offload_stats, elements))
      throw Error(TSR_ERR_INVALID, fmt("%s: stats struct missing or too small", kWho));
    tsr_offload_stats st = pipeline->stats();
    st.device_s = share.seconds();
    sdk::copy_out(st, out);
  }
};

std::unique_ptr<Cpu> build(const tsr_host *host, const tsr_config *cfg) {
  sdk::Config c(host, cfg);
  auto s = std::make_unique<Cpu>();
  s->host = host;
  s->threads_cfg = c.get_int("threads");
  s->pin = c.get_bool("pin_memory");
  s->pin_threads = c.get_bool("pin_threads");
  s->ratio = parse_ratio(c.get_string("ratio"), kWho);
  s->params_where = parse_params_home(c.get_string("params"), kWho, false);
  s->speculation_memory = c.get_string("speculation_memory");
  s->speculation_worst_case = c.get_bool("speculation_worst_case");
  const std::string policy = c.get_string("speculation");  // a choice, checked by the host
  s->speculation_adaptive = policy == "adaptive";
  uint64_t bytes = 0;
  if (s->speculation_memory != "auto" && s->speculation_memory != "0" &&
      !sdk::parse_size(s->speculation_memory, &bytes))
    throw Error(TSR_ERR_CONFIG, fmt("%s: speculation_memory = \"%s\": expected \"auto\", \"0\" (no "
                                    "speculation) or a size such as \"4GiB\" or \"512MiB\"",
                                    kWho, s->speculation_memory.c_str()));
  if (s->params_where != TSR_PARAMS_ON_DEVICE && (s->ratio.automatic || s->ratio.fraction > 0))
    throw Error(TSR_ERR_INVALID,
                fmt("%s: ratio keeps a share of the optimizer state and its step on the compute "
                    "device (the GPU in a CUDA run), "
                    "which updates parameters there; with params = \"cpu\" they live in host "
                    "memory: set ratio = \"0\"",
                    kWho));
  return s;
}

// Logs what the pipeline did, then joins its dispatcher before the buffers
// go.
Cpu::~Cpu() {
  if (pipeline) {
    const tsr_offload_stats st = pipeline->stats();
    if (st.elements > 0)
      host->log(host->ctx, TSR_LOG_DEBUG,
                fmt("%s: %llu elements updated on %u threads in %.3f s (%.2f G elements/s); "
                    "copies %.3f s to the host, %.3f s back",
                    kWho, static_cast<unsigned long long>(st.elements), pool->size(), st.host_s,
                    st.host_s > 0 ? st.elements / st.host_s / 1e9 : 0.0, st.d2h_s, st.h2d_s)
                    .c_str());
  }
  pipeline.reset();  // joins the dispatcher before the buffers go
}

// The host's state arrays, first-touched by the pool; in CUDA runs the two
// pinned transfer buffers. Returns the seconds each took.
std::pair<double, double> allocate(Cpu *s) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  // At least one element: the GPU may hold every owned element (ratio "auto"
  // decided at start-up), and a buffer of no bytes has no address.
  const size_t held_here = std::max<size_t>(s->n - s->first, 1);
  for (uint32_t i = 0; i < 1 + s->state_count; ++i) {
    s->slots.emplace_back(s->host, DLDevice{kDLCPU, 0}, held_here * sizeof(float),
                          TSR_MEM_OPTIMIZER);
    // Huge pages where the kernel has them: the step streams five arrays,
    // and 4 KiB pages would cost a page walk every 1024 elements of each.
    advise_huge_pages(s->slots.back().get(), s->slots.back().bytes());
    first_touch(*s->pool, s->slots.back().get(), s->slots.back().bytes());
  }
  const auto t1 = Clock::now();
  const size_t bytes = held_here * dtype_bytes(s->compute_dtype);
  const bool held = s->params_where != TSR_PARAMS_ON_DEVICE;
  if (s->cuda) {
    const DLDevice mem{s->pin ? kDLCUDAHost : kDLCPU, 0};
    s->grads_pinned = sdk::Buffer(s->host, mem, bytes, TSR_MEM_OTHER);
    // With offloaded parameters this upload buffer is where they live.
    s->params_pinned = sdk::Buffer(s->host, mem, bytes, held ? TSR_MEM_PARAMS : TSR_MEM_OTHER);
  } else if (held) {
    s->params_host = sdk::Buffer(s->host, DLDevice{kDLCPU, 0}, bytes, TSR_MEM_PARAMS);
    s->grads_host = sdk::Buffer(s->host, DLDevice{kDLCPU, 0}, bytes, TSR_MEM_GRADS);
  }
  const auto t2 = Clock::now();
  return {std::chrono::duration<double>(t1 - t0).count(),
          std::chrono::duration<double>(t2 - t1).count()};
}

// The undo space for every element the host holds: master, state and a
// compute parameter each.
double undo_whole(const Cpu *s) {
  return (s->n - s->first) * (4.0 * (1 + s->state_count) + dtype_bytes(s->compute_dtype));
}

// The undo space of speculation (undo.hpp): every owned element's master,
// state and compute parameter, or what `speculation_memory` allows of it
// ("auto": at most half of the host memory this rank has left once its
// state is allocated). First-touched like the state, so a speculative step
// takes no page faults.
//
// "auto" where half of what is left cannot hold every element at start-up
// waits for the first speculative step (size_undo_late): the engine's
// initial values of the whole model, a full fp32 copy, are gone by then,
// and an 8B model's undo space grows by half that copy.
void allocate_undo(Cpu *s, bool at_start) {
  // Each range's arrays start 64-byte aligned: 1 MiB covers that slack for
  // any plausible number of ranges.
  const double whole = undo_whole(s) + 1048576.0;
  double bytes = whole;
  if (s->speculation_memory == "0") {
    bytes = 0;
  } else if (s->speculation_memory == "auto") {
    const double half = host_memory_share(s->host) / 2;
    if (half > 0) bytes = std::min(whole, half);
    if (at_start && bytes < whole) {
      s->undo_deferred = true;
      return;
    }
  } else {
    uint64_t b = 0;
    sdk::parse_size(s->speculation_memory, &b);  // checked in build()
    bytes = std::min(whole, static_cast<double>(b));
    check_host_memory(s->host, kWho, bytes, "the speculation's undo space (speculation_memory)");
  }
  if (bytes < 4096) return;
  s->undo = sdk::Buffer(s->host, DLDevice{kDLCPU, 0}, static_cast<size_t>(bytes), TSR_MEM_OTHER);
  advise_huge_pages(s->undo.get(), s->undo.bytes());
  first_touch(*s->pool, s->undo.get(), s->undo.bytes());
}

// The speculation's undo space, where it lives and how much it holds.
void log_undo(Cpu *s) {
  const uint32_t rank = s->host->run ? s->host->run->rank : 0;
  if (s->undo_deferred) {
    s->host->log(s->host->ctx, TSR_LOG_INFO,
                 fmt("%s (rank %u): speculation (clipping, fp16): the undo space "
                     "(speculation_memory = \"auto\") is sized at the first speculative step, "
                     "once start-up's buffers are released: the host cannot hold every owned "
                     "element's now",
                     kWho, rank)
                     .c_str());
    return;
  }
  const double whole = undo_whole(s);
  s->host->log(s->host->ctx, TSR_LOG_INFO,
               fmt("%s (rank %u): speculation (clipping, fp16): an undo space of %.2f MiB in "
                   "pageable host memory holds the pre-step values of %s ranges stepped before "
                   "the gradient norm is known%s",
                   kWho, rank, mib(static_cast<double>(s->undo.bytes())),
                   s->undo.bytes() == 0                            ? "no (speculation off):"
                   : static_cast<double>(s->undo.bytes()) >= whole ? "all"
                                                                   : "the first",
                   s->speculation_adaptive && s->undo.bytes() > 0
                       ? "; after a step the norm clipped, the next holds its ranges for the "
                         "norm instead (speculation = \"adaptive\")"
                       : "")
                   .c_str());
}

void log_setup(Cpu *s, std::pair<double, double> took) {
  std::string names;
  for (uint32_t i = 0; i < s->state_count; ++i) {
    const char *nm = s->opt->state_name(s->opt_self, i);
    names += (i ? ", " : "") + std::string(nm ? nm : "?");
  }
  const double here = static_cast<double>(s->n - s->first);
  const double state_bytes = 4.0 * (1 + s->state_count) * here;
  const double staging = s->cuda ? 2.0 * here * dtype_bytes(s->compute_dtype) : 0.0;
  const uint32_t rank = s->host->run ? s->host->run->rank : 0;
  s->host->log(
      s->host->ctx, TSR_LOG_INFO,
      fmt("%s (rank %u): fp32 master weights and %u optimizer state array%s%s%s%s of %zu owned "
          "elements in pageable host memory: host %.2f MiB (+ %.2f MiB %s transfer buffers), disk "
          "0 MiB, "
          "ready in %.2f s (state %.2f s, pinning %.2f s); step on the CPU on %u thread(s), "
          "overlapped with the %s%s",
          kWho, rank, s->state_count, s->state_count == 1 ? "" : "s", names.empty() ? "" : " (",
          names.c_str(), names.empty() ? "" : ")", s->n - s->first, mib(state_bytes), mib(staging),
          s->pin ? "pinned" : "pageable", took.first + took.second, took.first, took.second,
          s->pool->size(), s->cuda ? "GPU" : "forward", s->share.describe().c_str())
          .c_str());
  log_undo(s);
  if (s->home.active())
    s->host->log(s->host->ctx, TSR_LOG_INFO,
                 fmt("%s (rank %u): compute parameters of the %zu owned elements in %s host "
                     "memory (%.2f MiB), not on the device: each group's slice is fetched just "
                     "before use and the CPU step writes it back in place",
                     kWho, rank, s->n, s->cuda && s->pin ? "pinned" : "pageable",
                     mib(static_cast<double>(s->home.bytes())))
                     .c_str());
}

void Cpu::setup(const tsr_offload_setup *st) {
  cuda = check_setup(host, st, kWho, kDevices, "in every rank's host memory");
  n = st->n;
  opt = st->optimizer;
  opt_self = st->optimizer_self;
  state_count = st->state_count;
  compute_dtype = st->compute_dtype;
  const unsigned threads =
      threads_cfg > 0 ? static_cast<unsigned>(threads_cfg) : default_threads(host);
  pool = std::make_unique<ThreadPool>(threads, pin_threads);
  const double cb = static_cast<double>(dtype_bytes(compute_dtype));
  const bool held = params_where != TSR_PARAMS_ON_DEVICE;
  const double per_element = 4.0 * (1 + state_count) + (cuda || held ? 2 * cb : 0);
  share.init(host, kWho, st);
  // ratio "auto" decides after the first step, from its peak; where the
  // host cannot hold the whole state there would be no first step, so it
  // decides now and the host holds only the rest.
  const double host_bytes = host_memory_share(host);
  if (ratio.automatic && cuda && !held && host_bytes > 0 && n * per_element > host_bytes)
    first = share.choose_at_start(host_bytes, n * per_element);
  check_host_memory(
      host, kWho, (n - first) * per_element,
      fmt("the master weights and optimizer state%s of %zu owned elements%s",
          held ? ", the offloaded parameters" : "", n - first,
          first ? fmt(" (%zu more on the GPU, all that fits there)", first).c_str() : ""));
  const std::pair<double, double> took = allocate(this);
  allocate_undo(this, true);
  PipelineSetup p;
  p.host = host;
  p.who = kWho;
  p.opt = opt;
  p.opt_self = opt_self;
  p.state_count = state_count;
  for (uint32_t i = 0; i < 1 + state_count; ++i) p.slots[i] = slot(i);
  p.compute_dtype = compute_dtype;
  p.pool = pool.get();
  p.cuda = cuda;
  p.device = st->device.device_id;
  p.grads_pinned = grads_pinned.as<char>();
  p.params_pinned = params_pinned.as<char>();
  p.grads_host = grads_host.as<char>();
  p.n = n;
  p.first = first;
  p.undo = undo.as<char>();
  p.undo_bytes = undo.bytes();
  p.worst_case = speculation_worst_case;
  p.adaptive = speculation_adaptive;
  if (held) {
    p.params_home = cuda ? params_pinned.as<char>() : params_host.as<char>();
    home.init(kWho, n, compute_dtype, p.params_home, cuda, p.device);
  }
  pipeline = std::make_unique<HostPipeline>(p);
  share.attach_host(p.slots);
  if (!ratio.automatic) share.resize(ratio.fraction);
  log_setup(this, took);
}

RangeUpdate range_of(const tsr_offload_step *st, size_t begin, size_t end) {
  RangeUpdate u;
  u.offset = st->offset + begin;
  u.count = end - begin;
  slice_segments(st->segments, st->num_segments, begin, end, u.segments);
  u.lr = st->lr;
  u.grad_scale = st->grad_scale;
  u.step = st->step;
  return u;
}

// The undo space deferred at start-up (allocate_undo), before the first
// speculative round: no range has been stepped ahead yet, and the flush
// keeps the pool's threads to the first touch of the new space.
void Cpu::size_undo_late() {
  undo_deferred = false;
  pipeline->flush();
  allocate_undo(this, false);
  pipeline->set_undo(undo.as<char>(), undo.bytes());
  log_undo(this);
}

void Cpu::step(const tsr_offload_step *st) {
  check_range(st->offset, st->count);
  if (st->count == 0) return;
  if (first_step < 0) first_step = st->step;
  if (ratio.automatic && !share.decided() && st->step != first_step) {
    // The first step has shown its peak: size the device share now.
    pipeline->flush();
    share.choose_auto();
  }
  // Owned elements below the split are the device's, the rest the host's.
  const size_t split = std::clamp(share.split(), st->offset, st->offset + st->count);
  const size_t cb = dtype_bytes(compute_dtype);
  if (split > st->offset) share.step(st, 0, split - st->offset);
  if (split < st->offset + st->count) {
    RangeUpdate u = range_of(st, split - st->offset, st->count);
    // NULL: the gradient sink's copy, which the backend holds already.
    u.grads =
        st->grads ? static_cast<const char *>(st->grads) + (split - st->offset) * cb : nullptr;
    u.params = st->params ? static_cast<char *>(st->params) + (split - st->offset) * cb : nullptr;
    pipeline->submit(std::move(u));
  }
}

void Cpu::read_state(uint32_t i, size_t offset, size_t count, float *dst) {
  check_range(offset, count);
  float *base = slot(i);
  // The device share's values live on the device; the rest here (from
  // owned element `first` on, which the share covers up to).
  const size_t on_dev = share.read(i, offset, count, dst);
  if (count > on_dev)
    std::memcpy(dst + on_dev, base + (offset + on_dev - first), (count - on_dev) * sizeof(float));
}

void Cpu::write_state(uint32_t i, size_t offset, size_t count, const float *src) {
  check_range(offset, count);
  // The host keeps its copy of what it holds, the device share's too where
  // it holds it (first = 0).
  const size_t lo = std::max(offset, first);
  if (offset + count > lo)
    std::memcpy(slot(i) + (lo - first), src + (lo - offset), (offset + count - lo) * sizeof(float));
  share.write(i, offset, count, src);
  // Offloaded parameters follow their masters (the initial values, a
  // checkpoint's), once no copy reads the old ones.
  if (i == 0 && home.active() && count) {
    pipeline->flush();
    home.finish();
    home.put_master(offset, count, src);
  }
}

const tsr_param_decl kParams[] = {
    kThreadsParam,
    sdk::param_min("sub_group_size", TSR_PARAM_INT, "16777216",
                   "kept for configs of earlier versions (DeepSpeed's sub_group_size); the "
                   "update now moves whole owned ranges, overlapped",
                   1024),
    sdk::param("pin_memory", TSR_PARAM_BOOL, "true",
               "CUDA runs: the gradient and parameter transfer buffers in pinned host memory"),
    sdk::param("pin_threads", TSR_PARAM_BOOL, "true",
               "keep each thread of the CPU step on its own core"),
    sdk::param_number_or("ratio", "0",
                         "share of the owned state kept and stepped on the GPU, 0 to 1 "
                         "(DeepSpeed's offload_optimizer.ratio), or \"auto\": the largest share "
                         "that fits beside the first step's peak under run.max_gpu_memory "
                         "(chosen at start-up where the host cannot hold the whole state)",
                         0.0, 1.0, "auto|#"),
    sdk::param_number_or("speculation_memory", "\"auto\"",
                         "with gradient clipping or fp16: host memory that keeps the pre-step "
                         "state of the ranges stepped before the gradient norm is known, so they "
                         "can be redone exactly; \"auto\" (every owned element, or half of the "
                         "host memory left), 0 (each update waits for the norm), bytes or a size "
                         "(\"8GiB\")",
                         0, 1e18, "auto|#|*"),
    sdk::param_choice("speculation", "\"adaptive\"",
                      "with gradient clipping or fp16: adaptive = a step after one whose norm "
                      "clipped or overflowed holds its ranges for the norm instead of stepping "
                      "them ahead, since they would likely be redone; always = every step steps "
                      "ahead what the undo space holds",
                      "adaptive|always"),
    sdk::param("speculation_worst_case", TSR_PARAM_BOOL, "false",
               "for tests and measurements: the norm's verdict waits until every range handed "
               "over has been stepped ahead, so every clipped step is redone in full"),
    sdk::param("params", TSR_PARAM_STRING, "\"none\"",
               "ZeRO stage 3: where this rank's compute parameters live, \"none\" (the GPU) or "
               "\"cpu\" (pinned host memory, fetched per group just before use; DeepSpeed's "
               "offload_param)"),
};

// ---- parameter offload (TSR_EXT_OFFLOAD_PARAMS) ----

int32_t params_home(void *self) {
  return static_cast<Cpu *>(self)->params_where;
}

tsr_status fetch_params(void *self, size_t offset, size_t count, void *dst, uint64_t *ticket) {
  auto *s = static_cast<Cpu *>(self);
  return sdk::guard(s->host, [&] {
    s->check_range(offset, count);
    if (!s->home.active())
      throw Error(TSR_ERR_INVALID, fmt("%s: fetch, but the parameters are not offloaded", kWho));
    s->pipeline->wait_range(offset, count);  // the last update of these has written them
    *ticket = s->home.fetch(offset, count, dst, s->host->compute_stream);
  });
}

tsr_status params_ready(void *self, uint64_t ticket) {
  auto *s = static_cast<Cpu *>(self);
  return sdk::guard(s->host, [&] { s->home.ready(ticket, s->host->compute_stream); });
}

void params_bytes(void *self, uint64_t *host_bytes, uint64_t *disk_bytes) {
  auto *s = static_cast<Cpu *>(self);
  if (host_bytes) *host_bytes = s->home.active() ? s->home.bytes() : 0;
  if (disk_bytes) *disk_bytes = 0;
}

const tsr_ext_offload_params kParamsExt = {tsr_ext_offload_params_STRUCT_SIZE, params_home,
                                           fetch_params, params_ready, params_bytes};

// ---- speculation (TSR_EXT_OFFLOAD_SPECULATE) ----

tsr_status spec_begin(void *self, uint32_t flags) {
  auto *s = static_cast<Cpu *>(self);
  return sdk::guard(s->host, [&] { s->spec_begin(flags); });
}

tsr_status spec_resolve(void *self, int32_t verdict, double grad_scale) {
  auto *s = static_cast<Cpu *>(self);
  return sdk::guard(s->host, [&] { s->spec_resolve(verdict, grad_scale); });
}

tsr_status spec_stats(void *self, tsr_speculate_stats *out) {
  auto *s = static_cast<Cpu *>(self);
  return sdk::guard(s->host, [&] {
    if (!out || out->struct_size < TSR_STRUCT_SIZE(tsr_speculate_stats, held_s))
      throw Error(TSR_ERR_INVALID, fmt("%s: speculation stats struct missing or too small", kWho));
    sdk::copy_out(s->pipeline->spec_stats(), out);
  });
}

const tsr_ext_offload_speculate kSpeculateExt = {tsr_ext_offload_speculate_STRUCT_SIZE, spec_begin,
                                                 spec_resolve, spec_stats};
const sdk::Extension kExtensions[] = {{TSR_EXT_OFFLOAD_PARAMS, &kParamsExt},
                                      {TSR_EXT_OFFLOAD_GRADS, &GradsExtension<Cpu>::table},
                                      {TSR_EXT_OFFLOAD_SPECULATE, &kSpeculateExt}};
const void *get_extension(const char *id) {
  return sdk::find_extension(kExtensions, id);
}

const tsr_offload_vtable kVtable = sdk::offload_vtable<Cpu, build>();

const tsr_plugin_descriptor kCpu = sdk::describe(TSR_KIND_OFFLOAD, "cpu", "1.5.0", kSummary,
                                                 kParams, kDevices, &kVtable, get_extension);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kCpu)
