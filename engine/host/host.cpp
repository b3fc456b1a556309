// The host table handed to plugins, and its engine-side state.
#include "host/host.hpp"

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <tessera/cpp/meminfo.hpp>

#include "backend/cpu/cpu_ops.hpp"
#include "util/error.hpp"
#include "util/text.hpp"
#ifdef TESSERA_HAVE_CUDA
#include "backend/cuda/cuda_ops.hpp"
#include "backend/cuda/device.hpp"
#endif

namespace tessera {

const char *purpose_name(tsr_mem_purpose p) {
  static const char *names[] = {"parameters",  "gradients",     "optimizer state",
                                "activations", "communication", "other"};
  return (p >= 0 && p < TSR_MEM_PURPOSE_COUNT) ? names[p] : "unknown";
}

struct Host::Impl {
  Host *self = nullptr;
  mutable std::mutex mu;
  std::string last_error;
  // Where a block came from decides how it is freed.
  enum class Kind { host, mapped, pinned, cuda };
  struct Block {
    size_t bytes;
    tsr_mem_purpose purpose;
    Kind kind;
  };
  std::unordered_map<void *, Block> blocks;
  MemoryStats stats;       // the compute device's (GPU in CUDA runs)
  MemoryStats host_stats;  // host memory in CUDA runs (pageable + pinned)
  size_t pinned = 0;       // of which pinned (page-locked for the copy engines)
  MemoryStats &stats_for(Kind k, bool cuda_run) {
    return (cuda_run && k != Kind::cuda) ? host_stats : stats;
  }
  std::deque<std::unique_ptr<tsr_config>> configs;
};

Host *host_from_ctx(tsr_host_ctx *ctx) {
  return ctx ? reinterpret_cast<Host::Impl *>(ctx)->self : nullptr;
}

// report_error's sink (util/error.hpp), installed when this file's code is
// linked in (every Host comes from here, so every ctx it can be given).
static void record_error(tsr_host_ctx *ctx, const std::string &message) {
  if (Host *h = host_from_ctx(ctx)) h->set_error(message);
}
[[maybe_unused]] static const bool g_error_sink_installed = (g_error_sink = record_error, true);

namespace {

// Host blocks from this size on are mapped from the kernel, not the heap.
constexpr size_t kMapAbove = size_t{64} << 20;

size_t page_round(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

void *map_host(size_t bytes) {
  const size_t len = page_round(bytes);
  void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)madvise(p, len, MADV_HUGEPAGE);  // fails harmlessly where there is no THP
  return p;
}

tsr_status cb_error(tsr_host_ctx *ctx, tsr_status code, const char *message) {
  return report_error(ctx, code == TSR_OK ? TSR_ERR_INTERNAL : code,
                      message ? message : "(no message)");
}

void cb_log(tsr_host_ctx *, int32_t level, const char *message) {
  const char *m = message ? message : "";
  switch (level) {
    case TSR_LOG_DEBUG:
      spdlog::debug("{}", m);
      break;
    case TSR_LOG_INFO:
      spdlog::info("{}", m);
      break;
    case TSR_LOG_WARN:
      spdlog::warn("{}", m);
      break;
    default:
      spdlog::error("{}", m);
      break;
  }
}

// Config reads report errors to the host that made the config.
tsr_status config_fail(const tsr_config *cfg, const char *key, const std::string &why) {
  std::string msg = "config [" + (cfg ? cfg->section : std::string("?")) + "] key '" +
                    (key ? key : "(null)") + "': " + why;
  if (cfg && cfg->host) cfg->host->set_error(msg);
  return TSR_ERR_CONFIG;
}

const toml::node *config_node(const tsr_config *cfg, const char *key) {
  if (!cfg || !key) return nullptr;
  return cfg->values.get(key);
}

tsr_status cb_config_bool(const tsr_config *cfg, const char *key, int32_t *out) {
  const toml::node *n = config_node(cfg, key);
  if (!n) return config_fail(cfg, key, "not declared by the plugin");
  if (!n->is_boolean()) return config_fail(cfg, key, "is not a boolean");
  *out = n->as_boolean()->get() ? 1 : 0;
  return TSR_OK;
}

tsr_status cb_config_int(const tsr_config *cfg, const char *key, int64_t *out) {
  const toml::node *n = config_node(cfg, key);
  if (!n) return config_fail(cfg, key, "not declared by the plugin");
  if (!n->is_integer()) return config_fail(cfg, key, "is not an integer");
  *out = n->as_integer()->get();
  return TSR_OK;
}

tsr_status cb_config_float(const tsr_config *cfg, const char *key, double *out) {
  const toml::node *n = config_node(cfg, key);
  if (!n) return config_fail(cfg, key, "not declared by the plugin");
  if (n->is_floating_point())
    *out = n->as_floating_point()->get();
  else if (n->is_integer())
    *out = static_cast<double>(n->as_integer()->get());
  else
    return config_fail(cfg, key, "is not a number");
  return TSR_OK;
}

tsr_status cb_config_string(const tsr_config *cfg, const char *key, const char **out) {
  const toml::node *n = config_node(cfg, key);
  if (!n) return config_fail(cfg, key, "not declared by the plugin");
  if (!n->is_string()) return config_fail(cfg, key, "is not a string");
  *out = n->as_string()->get().c_str();
  return TSR_OK;
}

tsr_status cb_config_array_size(const tsr_config *cfg, const char *key, size_t *out) {
  const toml::node *n = config_node(cfg, key);
  if (!n) return config_fail(cfg, key, "not declared by the plugin");
  if (!n->is_array()) return config_fail(cfg, key, "is not an array");
  *out = n->as_array()->size();
  return TSR_OK;
}

const toml::node *array_at(const tsr_config *cfg, const char *key, size_t i, tsr_status *st) {
  const toml::node *n = config_node(cfg, key);
  if (!n || !n->is_array()) {
    *st = config_fail(cfg, key, "is not a declared array");
    return nullptr;
  }
  if (i >= n->as_array()->size()) {
    *st = config_fail(cfg, key, "index " + std::to_string(i) + " is past the end");
    return nullptr;
  }
  return n->as_array()->get(i);
}

tsr_status cb_config_int_at(const tsr_config *cfg, const char *key, size_t i, int64_t *out) {
  tsr_status st = TSR_OK;
  const toml::node *e = array_at(cfg, key, i, &st);
  if (!e) return st;
  if (!e->is_integer()) return config_fail(cfg, key, "element is not an integer");
  *out = e->as_integer()->get();
  return TSR_OK;
}

tsr_status cb_config_float_at(const tsr_config *cfg, const char *key, size_t i, double *out) {
  tsr_status st = TSR_OK;
  const toml::node *e = array_at(cfg, key, i, &st);
  if (!e) return st;
  if (e->is_floating_point())
    *out = e->as_floating_point()->get();
  else if (e->is_integer())
    *out = static_cast<double>(e->as_integer()->get());
  else
    return config_fail(cfg, key, "element is not a number");
  return TSR_OK;
}

tsr_status cb_config_string_at(const tsr_config *cfg, const char *key, size_t i, const char **out) {
  tsr_status st = TSR_OK;
  const toml::node *e = array_at(cfg, key, i, &st);
  if (!e) return st;
  if (!e->is_string()) return config_fail(cfg, key, "element is not a string");
  *out = e->as_string()->get().c_str();
  return TSR_OK;
}

tsr_status cb_alloc(tsr_host_ctx *ctx, DLDevice device, size_t bytes, tsr_mem_purpose purpose,
                    void **out) {
  return guarded(ctx, [&] {
    TSR_CHECK(out != nullptr, TSR_ERR_INVALID, "alloc: out is NULL");
    *out = host_from_ctx(ctx)->alloc(device, bytes, purpose);
  });
}

void cb_free(tsr_host_ctx *ctx, void *ptr) {
  host_from_ctx(ctx)->free(ptr);
}

// splitmix64: a well-mixed 64-bit hash step.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t cb_seed_for(tsr_host_ctx *ctx, const char *stream, int32_t per_rank) {
  const auto &f = host_from_ctx(ctx)->facts();
  uint64_t h = mix(f.seed);
  for (const char *p = stream ? stream : ""; *p; ++p) h = mix(h ^ static_cast<uint8_t>(*p));
  if (per_rank) h = mix(h ^ (0x1000000ULL + f.rank));
  return h;
}

StepHooks *hooks_of(tsr_step *s) {
  return reinterpret_cast<StepHooks *>(s);
}

tsr_status cb_param(tsr_step *s, uint32_t index, DLTensor *out) {
  if (!s || !out) return TSR_ERR_INVALID;
  return hooks_of(s)->param(index, out);
}
tsr_status cb_grad(tsr_step *s, uint32_t index, DLTensor *out) {
  if (!s || !out) return TSR_ERR_INVALID;
  return hooks_of(s)->grad(index, out);
}
tsr_status cb_grads_done(tsr_step *s, uint32_t group) {
  if (!s) return TSR_ERR_INVALID;
  return hooks_of(s)->grads_done ? hooks_of(s)->grads_done(group) : TSR_OK;
}

tsr_status cb_params_done(tsr_step *s, uint32_t group) {
  if (!s) return TSR_ERR_INVALID;
  return hooks_of(s)->params_done ? hooks_of(s)->params_done(group) : TSR_OK;
}

tsr_status cb_grads_zeroed(tsr_step *s, int32_t *out) {
  if (!s || !out) return TSR_ERR_INVALID;
  *out = hooks_of(s)->grads_zeroed && hooks_of(s)->grads_zeroed() ? 1 : 0;
  return TSR_OK;
}

tsr_status cb_step_position(tsr_step *s, uint64_t *update, uint32_t *micro) {
  if (!s || !update || !micro) return TSR_ERR_INVALID;
  *update = hooks_of(s)->update;
  *micro = hooks_of(s)->micro;
  return TSR_OK;
}

tsr_status cb_synchronize(tsr_host_ctx *ctx) {
  return guarded(ctx, [&] {
#ifdef TESSERA_HAVE_CUDA
    if (host_from_ctx(ctx)->facts().device.device_type == kDLCUDA) cuda::synchronize();
#endif
  });
}

tsr_status cb_device_memory(tsr_host_ctx *ctx, tsr_device_memory *out) {
  return guarded(ctx, [&] {
    TSR_CHECK(out && out->struct_size >= TSR_STRUCT_SIZE(tsr_device_memory, limit), TSR_ERR_INVALID,
              "device_memory: struct_size too small");
    const Host &h = *host_from_ctx(ctx);
    const MemoryStats m = h.memory();
    out->in_use = m.current_total;
    out->peak = m.peak_total;
    out->limit = static_cast<size_t>(h.facts().max_gpu_memory);
#ifdef TESSERA_HAVE_CUDA
    if (out->limit == 0 && h.facts().device.device_type == kDLCUDA)
      out->limit = cuda::device_capacity();
#endif
  });
}

}  // namespace

Host::Host(RunFacts facts) : facts_(std::move(facts)), impl_(std::make_unique<Impl>()) {
  impl_->self = this;
  run_info_.struct_size = tsr_run_info_STRUCT_SIZE;
  run_info_.rank = facts_.rank;
  run_info_.world_size = facts_.world_size;
  run_info_.local_rank = facts_.local_rank;
  run_info_.local_world_size = facts_.local_world_size;
  run_info_.device = facts_.device;
  run_info_.precision = facts_.precision;
  run_info_.seed = facts_.seed;
  run_info_.run_dir = facts_.run_dir.c_str();

  table_.struct_size = tsr_host_STRUCT_SIZE;
  table_.abi_major = TSR_ABI_MAJOR;
  table_.abi_minor = TSR_ABI_MINOR;
  table_.ctx = ctx();
  table_.error = cb_error;
  table_.log = cb_log;
  table_.config_bool = cb_config_bool;
  table_.config_int = cb_config_int;
  table_.config_float = cb_config_float;
  table_.config_string = cb_config_string;
  table_.config_array_size = cb_config_array_size;
  table_.config_int_at = cb_config_int_at;
  table_.config_float_at = cb_config_float_at;
  table_.config_string_at = cb_config_string_at;
  table_.alloc = cb_alloc;
  table_.free = cb_free;
  table_.run = &run_info_;
  table_.ops = cpu_ops();
#ifdef TESSERA_HAVE_CUDA
  if (facts_.device.device_type == kDLCUDA) {
    table_.ops = cuda_ops();
    table_.compute_stream = cuda::compute_stream();
  }
#endif
  table_.synchronize = cb_synchronize;
  table_.comm = host_comm_table();
  table_.seed_for = cb_seed_for;
  table_.param = cb_param;
  table_.grad = cb_grad;
  table_.grads_done = cb_grads_done;
  table_.params_done = cb_params_done;
  table_.device_memory = cb_device_memory;
  table_.grads_zeroed = cb_grads_zeroed;
  table_.step_position = cb_step_position;
}

Host::~Host() {
  for (auto &[p, b] : impl_->blocks) {
#ifdef TESSERA_HAVE_CUDA
    if (b.kind == Impl::Kind::cuda) {
      cuda::device_free(p);
      continue;
    }
    if (b.kind == Impl::Kind::pinned) {
      cuda::pinned_free(p);
      continue;
    }
#endif
    std::free(p);
  }
}

tsr_host_ctx *Host::ctx() const {
  return reinterpret_cast<tsr_host_ctx *>(impl_.get());
}

std::string Host::last_error() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->last_error;
}

void Host::clear_error() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->last_error.clear();
}

void Host::set_error(const std::string &message) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->last_error = message;
}

tsr_config *Host::make_config(const std::string &section, const std::string &plugin,
                              toml::table values) {
  auto c = std::make_unique<tsr_config>();
  c->host = this;
  c->section = section;
  c->plugin = plugin;
  c->values = std::move(values);
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->configs.push_back(std::move(c));
  return impl_->configs.back().get();
}

MemoryStats Host::memory() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->stats;
}

size_t Host::pinned_bytes() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->pinned;
}

MemoryStats Host::host_memory() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return facts_.device.device_type == kDLCUDA ? impl_->host_stats : impl_->stats;
}

namespace {

// Which memory `device` asks for in a run whose compute device is a GPU
// (`cuda_run`) or not.
Host::Impl::Kind alloc_kind(DLDevice device, bool cuda_run) {
  using Kind = Host::Impl::Kind;
  Kind kind = Kind::host;
  if (device.device_type == kDLCUDA) {
    kind = Kind::cuda;
  } else if (device.device_type == kDLCUDAHost) {
    // Pinned memory where there is a GPU; plain memory otherwise (a CPU run
    // asks for it where it would overlap copies on a GPU).
    kind = cuda_run ? Kind::pinned : Kind::host;
  } else if (device.device_type != kDLCPU) {
    throw Error(TSR_ERR_UNSUPPORTED,
                "alloc: device type " + std::to_string(device.device_type) + " is not supported");
  }
  if (kind == Kind::cuda && !cuda_run)
    throw Error(TSR_ERR_UNSUPPORTED,
                "alloc: CUDA memory asked for in a run on the CPU (run.device); this build " +
                    std::string(
#ifdef TESSERA_HAVE_CUDA
                        "has CUDA, but the run did not select a GPU"
#else
                        "has no CUDA support"
#endif
                        ));
  return kind;
}

// run.max_gpu_memory: `bytes` more of `purpose` must fit under the cap.
[[maybe_unused]] void check_gpu_cap(const Host &h, size_t bytes, tsr_mem_purpose purpose) {
  const Host::RunFacts &f = h.facts();
  if (f.max_gpu_memory == 0) return;
  const MemoryStats now = h.memory();
  if (now.current_total + bytes <= f.max_gpu_memory) return;
  std::string use;
  for (int i = 0; i < TSR_MEM_PURPOSE_COUNT; ++i) {
    if (now.current[static_cast<size_t>(i)] == 0) continue;
    if (!use.empty()) use += ", ";
    use += std::string(purpose_name(i)) + " " +
           format_bytes(static_cast<double>(now.current[static_cast<size_t>(i)]));
  }
  throw Error(TSR_ERR_NO_MEMORY,
              "run.max_gpu_memory = " + format_bytes(static_cast<double>(f.max_gpu_memory)) +
                  " on rank " + std::to_string(f.rank) + ": " +
                  format_bytes(static_cast<double>(bytes)) + " of " + purpose_name(purpose) +
                  " do not fit (in use: " + (use.empty() ? std::string("nothing") : use) +
                  "); raise the cap, use a higher ZeRO stage or offload");
}

// A buffer larger than what the host has free fails here, at once and
// naming what asked for it, not after minutes of swapping or at the OOM
// killer's hand (the memset of a heap block touches every page): the CPU's
// counterpart of run.max_gpu_memory. Small buffers are not worth reading
// /proc/meminfo and the cgroup files for.
void check_host_room(const Host &h, size_t bytes, tsr_mem_purpose purpose) {
  if (bytes < (size_t{64} << 20)) return;
  const sdk::HostMemory host_mem = sdk::host_memory_available();
  const uint64_t avail = host_mem.bytes;
  if (avail == 0 || bytes <= avail) return;
  const MemoryStats now = h.memory();
  throw Error(TSR_ERR_NO_MEMORY,
              "rank " + std::to_string(h.facts().rank) + ": " +
                  format_bytes(static_cast<double>(bytes)) + " of " + purpose_name(purpose) +
                  " do not fit in the " + format_bytes(static_cast<double>(avail)) +
                  " of memory this host has available (" + host_mem.source + "; this rank holds " +
                  format_bytes(static_cast<double>(now.current_total)) +
                  " already); use a smaller model, more ranks with a higher ZeRO stage, "
                  "or offload to NVMe");
}

// `bytes` of zeroed memory of `kind` (host memory may come back mapped:
// `kind` says so), or nullptr.
void *zeroed_block(const Host &h, size_t bytes, tsr_mem_purpose purpose, Host::Impl::Kind *kind) {
  using Kind = Host::Impl::Kind;
  void *p = nullptr;
  if (*kind == Kind::cuda) {
#ifdef TESSERA_HAVE_CUDA
    check_gpu_cap(h, bytes, purpose);
    p = cuda::device_alloc(bytes);
    // Fresh buffers are zero, as on the CPU: plugins may rely on it.
    TSR_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda::compute_stream()));
#endif
  } else if (*kind == Kind::pinned) {
#ifdef TESSERA_HAVE_CUDA
    bool zeroed = false;
    p = cuda::pinned_alloc(bytes, &zeroed);
    if (p && !zeroed) std::memset(p, 0, bytes);
#endif
  } else if (bytes >= kMapAbove) {
    // Large host blocks (optimizer state, offload buffers) come straight
    // from the kernel: its pages are zero already, so nothing writes them
    // here on one thread; the plugin's own threads fault them in where
    // they will work on them, on huge pages where the kernel has them.
    p = map_host(bytes);
    if (p) *kind = Kind::mapped;
  } else {
    check_host_room(h, bytes, purpose);
    // 64-byte alignment for vector loads; zeroed so fresh buffers are
    // deterministic.
    size_t rounded = (bytes + 63) / 64 * 64;
    p = std::aligned_alloc(64, rounded);
    if (p) std::memset(p, 0, rounded);
  }
  return p;
}

}  // namespace

void *Host::alloc(DLDevice device, size_t bytes, tsr_mem_purpose purpose) {
  if (bytes == 0) return nullptr;
  if (purpose < 0 || purpose >= TSR_MEM_PURPOSE_COUNT)
    throw Error(TSR_ERR_INVALID, "alloc: unknown purpose " + std::to_string(purpose));
  const bool cuda_run = facts_.device.device_type == kDLCUDA;
  Impl::Kind kind = alloc_kind(device, cuda_run);
  void *p = zeroed_block(*this, bytes, purpose, &kind);
  if (!p)
    throw Error(TSR_ERR_NO_MEMORY,
                "cannot allocate " + std::to_string(bytes) + " bytes for " + purpose_name(purpose));
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->blocks[p] = {bytes, purpose, kind};
  auto &s = impl_->stats_for(kind, cuda_run);
  s.current[purpose] += bytes;
  s.peak[purpose] = std::max(s.peak[purpose], s.current[purpose]);
  s.current_total += bytes;
  s.peak_total = std::max(s.peak_total, s.current_total);
  if (kind == Impl::Kind::pinned) impl_->pinned += bytes;
  return p;
}

void Host::free(void *ptr) {
  if (!ptr) return;
  Impl::Block b{};
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    auto it = impl_->blocks.find(ptr);
    if (it == impl_->blocks.end()) {
      spdlog::error("free of a pointer the host did not allocate ({})", ptr);
      return;
    }
    b = it->second;
    auto &s = impl_->stats_for(b.kind, facts_.device.device_type == kDLCUDA);
    s.current[b.purpose] -= b.bytes;
    s.current_total -= b.bytes;
    if (b.kind == Impl::Kind::pinned) impl_->pinned -= b.bytes;
    impl_->blocks.erase(it);
  }
#ifdef TESSERA_HAVE_CUDA
  if (b.kind == Impl::Kind::cuda) {
    // Work queued on the compute stream may still use the block; the
    // caching allocator hands it out again only to later work on the same
    // stream, so ordering holds without a sync.
    cuda::device_free(ptr);
    return;
  }
  if (b.kind == Impl::Kind::pinned) {
    cuda::synchronize();  // a pending copy may still read it
    cuda::pinned_free(ptr);
    return;
  }
#endif
  if (b.kind == Impl::Kind::mapped) {
    munmap(ptr, page_round(b.bytes));
    return;
  }
  std::free(ptr);
}

}  // namespace tessera
