// host_offload: a tessera offload backend that keeps the fp32 master weights
// and the optimizer state in host memory and runs the optimizer on a worker
// thread, fed through two staging buffers (double buffering).
//
// The engine's zero plugin calls step() once per owned range and flush()
// when the optimizer step must be complete. Here step() only stages: it
// splits the range into chunks of at most `chunk` elements, copies each
// chunk's gradients into one of two staging buffers (in a GPU build, this is
// where the device-to-host copy would go) and queues the update. The worker
// runs the optimizer it was handed in setup() (through its vtable) on the
// host-resident master weights and state, writing the updated compute
// parameters into the range's params buffer, then frees the staging buffer.
// So the copy of chunk i + 1 overlaps the update of chunk i, and step()
// returns before the updates are done; flush() waits for all of them. The
// zero plugin keeps `grads` and `params` valid until flush, but the
// segments array only for the call, so it is copied.
//
// With async = false every update runs inside step(), as the shipped `none`
// backend does. At the end the backend logs what it did: updates, elements,
// bytes staged, and how long flush() waited for the worker.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <tessera/cpp/offload.hpp>
#include <tessera/cpp/plugin.hpp>
#include <thread>
#include <vector>

namespace {

namespace sdk = tessera::sdk;
using sdk::Error;

// One queued update: owned elements [offset, offset + count), their
// gradients in staging buffer `buffer`.
struct Job {
  size_t offset = 0, count = 0;
  int buffer = 0;
  float *params_out = nullptr;        // where the updated compute parameters go
  std::vector<tsr_segment> segments;  // relative to offset
  double lr = 0, grad_scale = 1;
  int64_t step = 0;
};

// The backend. sdk::offload_vtable (tessera/cpp/offload.hpp) turns its
// members setup .. write_state into the C function table, every call
// guarded. It has no wait_params, wait_grads or stats (ABI 1.2's overlapped
// step), so its table ends at write_state and the host calls flush().
struct Offload {
  static constexpr const char *kName = "host_offload";  // for the adapter's messages
  const tsr_host *host = nullptr;
  bool async = true;
  size_t chunk = 0;

  size_t n = 0;  // owned elements
  const tsr_optimizer_vtable *opt = nullptr;
  void *opt_self = nullptr;
  std::vector<sdk::Buffer> slots;  // [0]: master weights, [1 + i]: optimizer state i
  sdk::Buffer staging[2];          // gradients of a chunk on its way to the worker

  // The queue between step() and the worker, and the state of the staging
  // buffers, under `mu`.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;
  bool buffer_busy[2] = {false, false};
  bool worker_busy = false, stopping = false;
  tsr_status failed = TSR_OK;  // the first failed update since the last flush
  int next_buffer = 0;
  std::thread worker;

  // What it did, for the log.
  uint64_t updates = 0, elements = 0, bytes_staged = 0;
  double flush_wait_s = 0;

  ~Offload() {
    log_totals();
    if (worker.joinable()) {
      {
        std::lock_guard<std::mutex> lk(mu);
        stopping = true;
      }
      cv.notify_all();
      worker.join();
    }
  }

  float *slot(uint32_t i) const {
    if (i >= slots.size())
      throw Error(TSR_ERR_INVALID, "host_offload: no state slot " + std::to_string(i));
    return slots[i].as<float>();
  }
  void check_range(size_t offset, size_t count) const {
    if (offset > n || count > n - offset)
      throw Error(TSR_ERR_INVALID, "host_offload: range [" + std::to_string(offset) + ", +" +
                                       std::to_string(count) + ") is past the " +
                                       std::to_string(n) + " owned elements");
  }

  // Runs the optimizer on one job: master weights and state in host memory,
  // gradients from the staging buffer.
  tsr_status run(const Job &j) {
    std::vector<float *> state(slots.size() - 1);
    for (size_t i = 0; i < state.size(); ++i) state[i] = slots[1 + i].as<float>() + j.offset;
    auto a = sdk::make<tsr_optimizer_step_args>();
    a.device = DLDevice{kDLCPU, 0};
    a.params = slot(0) + j.offset;
    a.grads = staging[j.buffer].as<float>();
    a.state = state.data();
    a.n = j.count;
    a.segments = j.segments.data();
    a.num_segments = j.segments.size();
    a.lr = j.lr;
    a.grad_scale = j.grad_scale;
    a.step = j.step;
    a.compute_params = j.params_out;
    a.compute_dtype = sdk::dtype_f32();
    return opt->step(opt_self, &a);
  }

  // The worker: runs queued jobs in order, one at a time. The optimizer
  // records its own error message with the host; the status waits for flush.
  void work() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return stopping || !queue.empty(); });
      if (stopping) return;  // destroy: the engine flushed; drop anything left
      Job j = std::move(queue.front());
      queue.pop_front();
      worker_busy = true;
      const bool skip = failed != TSR_OK;  // after a failure, drop the rest of the step
      lk.unlock();
      const tsr_status s = skip ? TSR_OK : run(j);
      lk.lock();
      if (s != TSR_OK && failed == TSR_OK) failed = s;
      buffer_busy[j.buffer] = false;
      worker_busy = false;
      cv.notify_all();
    }
  }

  // Waits until the worker has run every queued job; returns (and clears)
  // the first failure.
  tsr_status wait_idle() {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return queue.empty() && !worker_busy; });
    flush_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const tsr_status s = failed;
    failed = TSR_OK;
    return s;
  }

  // What it did, at the end.
  void log_totals() const {
    if (updates == 0) return;
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "host_offload: %llu updates of %llu elements, %.1f MiB of gradients staged, "
                  "%s; flush waited %.3f s in all",
                  static_cast<unsigned long long>(updates),
                  static_cast<unsigned long long>(elements),
                  static_cast<double>(bytes_staged) / (1 << 20),
                  async ? "updates on a worker thread" : "updates inline", flush_wait_s);
    host->log(host->ctx, TSR_LOG_INFO, msg);
  }

  void setup(const tsr_offload_setup *s) {
    if (!TSR_HAS_FIELD(s, tsr_offload_setup, compute_dtype))
      throw Error(TSR_ERR_INVALID, "host_offload: setup struct missing or too small");
    if (s->device.device_type != kDLCPU)
      throw Error(TSR_ERR_UNSUPPORTED,
                  "host_offload: this build stages gradients from the CPU only (device type " +
                      std::to_string(s->device.device_type) + ")");
    if (s->compute_dtype.code != kDLFloat || s->compute_dtype.bits != 32)
      throw Error(TSR_ERR_UNSUPPORTED, "host_offload: compute must be float32");
    n = s->n;
    opt = s->optimizer;
    opt_self = s->optimizer_self;
    const DLDevice host_memory{kDLCPU, 0};
    for (uint32_t i = 0; i < 1 + s->state_count; ++i)
      slots.emplace_back(host, host_memory, n * sizeof(float), TSR_MEM_OPTIMIZER);
    const size_t staged = std::min(chunk, n);
    for (sdk::Buffer &b : staging)
      b = sdk::Buffer(host, host_memory, staged * sizeof(float), TSR_MEM_OTHER);
    if (async) worker = std::thread([this] { work(); });
  }

  void step(const tsr_offload_step *s) {
    if (!TSR_HAS_FIELD(s, tsr_offload_step, step))
      throw Error(TSR_ERR_INVALID, "host_offload: step struct missing or too small");
    check_range(s->offset, s->count);
    if (s->num_segments > 0 && !s->segments)
      throw Error(TSR_ERR_INVALID, "host_offload: segments must not be NULL");
    for (size_t begin = 0; begin < s->count; begin += chunk)
      stage(s, begin, std::min(begin + chunk, s->count));
  }

  void flush() { sdk::check(wait_idle()); }

  // Checkpoints and the initial weights go through these; let pending
  // updates land first.
  void read_state(uint32_t i, size_t offset, size_t count, float *dst) {
    sdk::check(wait_idle());
    check_range(offset, count);
    std::memcpy(dst, slot(i) + offset, count * sizeof(float));
  }

  void write_state(uint32_t i, size_t offset, size_t count, const float *src) {
    sdk::check(wait_idle());
    check_range(offset, count);
    std::memcpy(slot(i) + offset, src, count * sizeof(float));
  }

  // Stages one chunk: waits for a free staging buffer, copies the gradients
  // in, and queues (or, without async, runs) the update.
  void stage(const tsr_offload_step *s, size_t begin, size_t end) {
    Job j;
    j.offset = s->offset + begin;
    j.count = end - begin;
    j.params_out = static_cast<float *>(s->params) + begin;
    j.lr = s->lr;
    j.grad_scale = s->grad_scale;
    j.step = s->step;
    for (size_t k = 0; k < s->num_segments; ++k) {  // the segments inside the chunk, rebased
      const tsr_segment &g = s->segments[k];
      const size_t lo = std::max(g.offset, begin), hi = std::min(g.offset + g.count, end);
      if (lo < hi) j.segments.push_back(tsr_segment{lo - begin, hi - lo, g.decay});
    }
    const float *grads = static_cast<const float *>(s->grads) + begin;
    {
      std::unique_lock<std::mutex> lk(mu);
      j.buffer = next_buffer;
      next_buffer ^= 1;
      cv.wait(lk, [&] { return !buffer_busy[j.buffer]; });
      buffer_busy[j.buffer] = true;
    }
    std::memcpy(staging[j.buffer].get(), grads, j.count * sizeof(float));
    ++updates;
    elements += j.count;
    bytes_staged += j.count * sizeof(float);
    if (async) {
      {
        std::lock_guard<std::mutex> lk(mu);
        queue.push_back(std::move(j));
      }
      cv.notify_all();
    } else {
      const tsr_status st = run(j);
      buffer_busy[j.buffer] = false;
      sdk::check(st);
    }
  }
};

const tsr_param_decl kParams[] = {
    sdk::param("async", TSR_PARAM_BOOL, "true",
               "run updates on a worker thread, overlapping the next chunk's staging; false: "
               "run each inside step()"),
    sdk::param_min("chunk", TSR_PARAM_INT, "262144",
                   "elements per staged update; each of the two staging buffers holds one chunk",
                   1),
};

// create: a new backend from the [offload] config.
std::unique_ptr<Offload> build(const tsr_host *host, const tsr_config *cfg) {
  sdk::Config c(host, cfg);
  auto o = std::make_unique<Offload>();
  o->host = host;
  o->async = c.get_bool("async");
  o->chunk = static_cast<size_t>(c.get_int("chunk"));
  return o;
}

const tsr_offload_vtable kVtable = sdk::offload_vtable<Offload, build>();

const tsr_plugin_descriptor kDescriptor = sdk::describe(
    TSR_KIND_OFFLOAD, "host_offload", "1.0.0",
    "master weights and optimizer state in host memory; updates on a worker thread fed through "
    "two staging buffers",
    kParams, TSR_DEVICE_CPU, &kVtable);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kDescriptor)
