// Offload "nvme": the fp32 master weights and the optimizer state of the
// elements this rank owns live in a file, `path`/rank<R>.state, and stream
// through three 4096-byte-aligned host buffers (pinned in CUDA runs) while
// the optimizer's CPU step updates them on a thread pool.
//
// File layout: the owned elements in blocks of `sub_group_size` elements B
// (a multiple of 1024, so every block and slot is 4096-byte aligned); block
// b holds its master weights, then each state array, B floats each, at byte
// b * (1 + k) * 4B. One block is one read and one write.
//
// step() only records the range (its gradients and compute parameters stay
// valid until the host's wait_grads; the segments are copied). The walk
// (walk.cpp) then goes through every block the recorded ranges touch, once,
// in order, on a thread of its own:
//
//   buffer (i + 1) % 3:  read block i + 1           (io_uring)
//   buffer i % 3:        update block i             (CPU threads)
//   buffer (i - 1) % 3:  write block i - 1 back     (io_uring)
//
// so disk reads, writes and the update overlap. It overlaps the GPU too
// (ABI 1.2): the host does not flush after the update but asks for each
// group's parameters as the next forward reaches them (wait_params), which
// waits only for the blocks holding them; the walk starts at the first
// such call. Reads and writes use
// O_DIRECT where the file system takes it (not tmpfs: buffered I/O then,
// with a warning), through io_uring (liburing) where the kernel allows it
// (synchronous pread / pwrite otherwise, with a warning).
//
// `params` (ZeRO stage 3, DeepSpeed's offload_param) keeps the owned compute
// parameters off the device too: "cpu" in host memory (param_home.hpp),
// "nvme" in the state file, after each block's state arrays (B compute-dtype
// elements; B is then a multiple of 4096 bytes of them), so the update
// writes them with the block and the zero plugin's fetch reads a group's
// slice through three buffers of its own, io_uring keeping the next block's read
// in flight while the last one crosses to the GPU. An update of every
// element of a block (a step's) rewrites its parameters whole, so it reads
// only the masters and state: a step reads 4(1 + k) bytes an element for
// the update plus the compute dtype's per fetch (of the whole blocks a
// group touches), and writes 4(1 + k) plus the compute dtype's. With adam in
// bf16 and a group fetched for the forward and again for the backward:
// about 12 + 2 + 2 = 16 bytes read, 14 written.
//
// With either `params` the backend also holds the gradients (the gradient
// sink, grad_sink.hpp): the zero plugin hands each bucket's reduced owned
// slice over as it is reduce-scattered, into host memory (pinned in CUDA
// runs), and the update reads them there; none stay on the device.
//
// Setup checks the file system's free space (statvfs) and preallocates the
// whole file (fallocate), so a full disk or an unwritable path is an error
// at start-up, not mid-run. The file is scratch: it is removed when the run
// ends (checkpoints hold the state).
#include "nvme.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <tessera/cpp/offload.hpp>

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "optimizer state in files on a local disk (io_uring, O_DIRECT), step on the CPU";

using namespace tessera::offload;
using namespace tessera::offload::nvme;

#if TSR_PLUGIN_CUDA
constexpr uint32_t kDevices = TSR_DEVICE_CPU | TSR_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = TSR_DEVICE_CPU;
#endif

std::unique_ptr<Nvme> build(const tsr_host *host, const tsr_config *cfg) {
  sdk::Config c(host, cfg);
  auto s = std::make_unique<Nvme>();
  s->host = host;
  s->path = c.get_string("path");
  s->threads_cfg = c.get_int("threads");
  s->sub_group = static_cast<size_t>(c.get_int("sub_group_size"));
  s->overlap = c.get_bool("overlap");
  s->cache_slots = static_cast<size_t>(c.get_int("param_cache"));
  s->params_where = parse_params_home(c.get_string("params"), kWho, true);
  return s;
}

// Creates and preallocates the state file; every failure here is a clear
// start-up error.
void open_file(Nvme *s) {
  namespace fs = std::filesystem;
  if (s->path.empty())
    throw Error(TSR_ERR_CONFIG,
                fmt("%s: set offload.path to a directory on a fast local disk (NVMe)", kWho));
  std::error_code ec;
  fs::create_directories(s->path, ec);
  if (ec || !fs::is_directory(s->path))
    throw Error(TSR_ERR_IO,
                fmt("%s: offload.path '%s' is not a directory that can be created: %s", kWho,
                    s->path.c_str(), ec ? ec.message().c_str() : "a file is in the way"));
  const uint32_t rank = s->host->run ? s->host->run->rank : 0;
  s->file = (fs::path(s->path) / fmt("rank%u.state", rank)).string();
  s->io.name = s->file;
  const size_t need = s->blocks * s->block_bytes;
  struct statvfs vfs {};
  if (statvfs(s->path.c_str(), &vfs) == 0) {
    const double avail = double(vfs.f_bavail) * double(vfs.f_frsize);
    if (double(need) > avail)
      throw Error(TSR_ERR_IO,
                  fmt("%s: rank %u needs %.2f GiB in '%s' for its master weights and optimizer "
                      "state, but that file system has %.2f GiB free; free space, use a larger "
                      "disk or more ranks",
                      kWho, rank, need / 1073741824.0, s->path.c_str(), avail / 1073741824.0));
  }
  int fd = open(s->file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {
    s->direct = false;
    fd = open(s->file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  }
  if (fd < 0)
    throw Error(TSR_ERR_IO,
                fmt("%s: cannot create '%s': %s", kWho, s->file.c_str(), std::strerror(errno)));
  s->io.fd = fd;
  if (need > 0) {
    int err = fallocate(fd, 0, 0, static_cast<off_t>(need)) == 0 ? 0 : errno;
    if (err == EOPNOTSUPP) err = posix_fallocate(fd, 0, static_cast<off_t>(need));
    if (err)
      throw Error(TSR_ERR_IO, fmt("%s: cannot preallocate %.2f GiB for '%s': %s", kWho,
                                  need / 1073741824.0, s->file.c_str(), std::strerror(err)));
  }
  // Some file systems open with O_DIRECT and refuse it on the first
  // transfer: try one block, fall back to buffered I/O.
  if (s->direct && need > 0) {
    const ssize_t r = pwrite(fd, s->buf[0], s->block_bytes, 0);
    if (r < 0 && errno == EINVAL) {
      s->direct = false;
      const int flags = fcntl(fd, F_GETFL);
      if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_DIRECT) < 0)
        throw Error(TSR_ERR_IO, fmt("%s: cannot turn O_DIRECT off on '%s': %s", kWho,
                                    s->file.c_str(), std::strerror(errno)));
    } else if (r != static_cast<ssize_t>(s->block_bytes)) {
      throw Error(TSR_ERR_IO, fmt("%s: cannot write '%s': %s", kWho, s->file.c_str(),
                                  r < 0 ? std::strerror(errno) : "short write"));
    }
  }
  if (!s->direct) {
    const std::string w =
        fmt("%s: '%s' does not take O_DIRECT (tmpfs?); using buffered I/O, so "
            "the page cache may hold a second copy of the state",
            kWho, s->path.c_str());
    s->host->log(s->host->ctx, TSR_LOG_WARN, w.c_str());
  }
}

// The start-up report: where state, parameters and gradients live, in bytes.
void log_setup(Nvme *s, unsigned threads, double staging) {
  const uint32_t rank = s->host->run ? s->host->run->rank : 0u;
  std::string names;
  for (uint32_t i = 0; i < s->state_count; ++i) {
    const char *nm = s->opt->state_name(s->opt_self, i);
    names += (i ? ", " : "") + std::string(nm ? nm : "?");
  }
  const std::string msg =
      fmt("%s (rank %u): fp32 master weights and %u optimizer state array%s%s%s%s of %zu owned "
          "elements on disk: disk %.2f MiB in %s (%s, %s), host %.2f MiB of %s staging "
          "buffers%s; step on the CPU on %u thread(s), blocks of %zu elements",
          kWho, rank, s->state_count, s->state_count == 1 ? "" : "s", names.empty() ? "" : " (",
          names.c_str(), names.empty() ? "" : ")", s->n, mib(double(s->blocks * s->block_bytes)),
          s->file.c_str(), s->direct ? "O_DIRECT" : "buffered",
          s->io.ring() ? "io_uring" : "pread/pwrite", mib(staging), s->cuda ? "pinned" : "aligned",
          s->cuda ? ", GPU 0 MiB" : "", threads, s->block);
  s->host->log(s->host->ctx, TSR_LOG_INFO, msg.c_str());
  if (s->params_where == TSR_PARAMS_ON_DEVICE) return;
  const double cb = double(dtype_bytes(s->compute_dtype));
  s->host->log(s->host->ctx, TSR_LOG_INFO,
               fmt("%s (rank %u): compute parameters of the %zu owned elements %s (%.2f MiB), "
                   "not on the device: each group's slice is fetched just before use",
                   kWho, rank, s->n,
                   s->on_disk() ? "in the state file, beside each block's state" : "in host memory",
                   mib(double(s->n) * cb))
                   .c_str());
  // Where the gradients go: the zero plugin hands them to the sink (the
  // host wires it with parameter offload), so none stay on the device.
  s->host->log(s->host->ctx, TSR_LOG_INFO,
               fmt("%s (rank %u): gradients of the %zu owned elements in %s host memory "
                   "(%.2f MiB), not on the device: each bucket's reduced slice is copied there "
                   "as it is reduce-scattered, and the update reads it there",
                   kWho, rank, s->n, s->cuda ? "pinned" : "pageable", mib(double(s->sink.bytes())))
                   .c_str());
}

// With offloaded parameters, the gradients come along: every owned one in
// host memory `mem`, where the zero plugin's sink puts them.
void init_sink(Nvme *s, DLDevice mem) {
  const size_t cb = dtype_bytes(s->compute_dtype);
  s->grads_buf = sdk::Buffer(s->host, mem, std::max<size_t>(s->n, 1) * cb, TSR_MEM_GRADS);
  GradSinkSetup g;
  g.host = s->host;
  g.who = kWho;
  g.n = s->n;
  g.dtype = s->compute_dtype;
  g.data = s->grads_buf.as<char>();
  g.cuda = s->cuda;
  g.pool = s->pool.get();
#if TSR_PLUGIN_CUDA
  g.copies = &s->copies;
#endif
  s->sink.init(g);
}

// The compute copy of owned [lo, hi) in block b from their masters
// (params = "nvme": the initial values, a checkpoint's).
void put_params_on_disk(Nvme *s, size_t b, size_t lo, size_t hi, const float *master) {
  const size_t lo_b = b * s->block, cb = dtype_bytes(s->compute_dtype);
  const size_t region = s->params_region();
  if (lo != lo_b || hi != lo_b + s->block)
    s->io.sync(false, s->buf[0], region, s->params_offset(b));
  to_compute(master, hi - lo, s->compute_dtype, s->buf[0] + (lo - lo_b) * cb);
  s->io.sync(true, s->buf[0], region, s->params_offset(b));
}

// Slot `slot` of owned elements [offset, offset + count) to or from host
// memory, block by block through buffer 0 (once the walk has ended; the
// fetches have buffers of their own).
void copy_state(Nvme *s, uint32_t slot, size_t offset, size_t count, float *dst, const float *src) {
  s->check_range(offset, count);
  if (slot > s->state_count) throw Error(TSR_ERR_INVALID, fmt("%s: no state slot %u", kWho, slot));
  walk_settle(s);
  if (src) s->cache.clear();  // the regions on disk may change
  const size_t slot_bytes = s->block * sizeof(float);
  float *bb = reinterpret_cast<float *>(s->buf[0]);
  for (size_t pos = offset, end = offset + count; pos < end;) {
    const size_t b = pos / s->block, lo_b = b * s->block;
    const size_t e = std::min(end, lo_b + s->block);
    const off_t at = s->block_offset(b) + static_cast<off_t>(slot * slot_bytes);
    if (dst) {
      s->io.sync(false, s->buf[0], slot_bytes, at);
      std::memcpy(dst + (pos - offset), bb + (pos - lo_b), (e - pos) * sizeof(float));
    } else {
      if (pos != lo_b || e != lo_b + s->block) s->io.sync(false, s->buf[0], slot_bytes, at);
      std::memcpy(bb + (pos - lo_b), src + (pos - offset), (e - pos) * sizeof(float));
      s->io.sync(true, s->buf[0], slot_bytes, at);
      if (slot == 0 && s->on_disk()) put_params_on_disk(s, b, pos, e, src + (pos - offset));
    }
    pos = e;
  }
  if (src && slot == 0 && s->home.active()) {
    s->home.finish();
    s->home.put_master(offset, count, src);
  }
}

}  // namespace

namespace tessera::offload::nvme {

// The closing debug line: what the update and the fetches asked of the disk.
void Nvme::log_totals() const {
  if (updates > 0) {
    // Bytes per element of the blocks updated: what one step asks of the
    // disk for each owned element, padding of a last partial block aside.
    const double elems = double(updates) * double(block);
    const std::string msg = fmt(
        "%s: %llu block updates, %.1f MiB read, %.1f MiB written (%.2f B and %.2f B an "
        "element), %.1f MiB of parameters read by fetches (and %.1f MiB taken from the cache "
        "of recent blocks), %.3f s updating, %.3f s waiting for the disk",
        kWho, static_cast<unsigned long long>(updates), mib(double(bytes_read)),
        mib(double(bytes_written)), double(bytes_read) / elems, double(bytes_written) / elems,
        mib(double(fetch_bytes_read)), mib(double(fetch_bytes_cached)), update_s.load(), io_wait_s);
    host->log(host->ctx, TSR_LOG_DEBUG, msg.c_str());
  }
}

void Nvme::setup(const tsr_offload_setup *st) {
  cuda = check_setup(host, st, kWho, kDevices, "on every rank's disk");
  device_id = st->device.device_id;
  n = st->n;
  opt = st->optimizer;
  opt_self = st->optimizer_self;
  state_count = st->state_count;
  compute_dtype = st->compute_dtype;
  // Blocks: a multiple of 1024 floats (4096 bytes), no larger than needed;
  // with the parameters on disk also of 4096 bytes of the compute dtype.
  const size_t cb = dtype_bytes(compute_dtype);
  const size_t align = on_disk() ? std::max(kDirectAlign / 4, kDirectAlign / cb) : kDirectAlign / 4;
  block = align_up(std::min(sub_group, std::max<size_t>(n, 1)), align);
  blocks = (n + block - 1) / block;
  block_bytes = (1 + state_count) * block * sizeof(float) + params_region();
  const bool home_host = params_where == TSR_PARAMS_ON_HOST;
  // Offloaded parameters bring the gradients along (the sink's buffer).
  const bool held = params_where != TSR_PARAMS_ON_DEVICE;
  check_host_memory(
      host, kWho,
      kBuffers * double(block_bytes + kDirectAlign) + (home_host ? double(n) * cb : 0.0) +
          (held ? double(n) * cb : 0.0) + (cuda ? 3.0 * block * cb : 0.0) +
          (on_disk() ? (kBuffers + cache_slots) * double(params_region()) : 0.0),
      fmt("the staging buffers%s%s of %zu owned elements",
          home_host ? ", the offloaded parameters" : "", held ? ", the gradients" : "", n));
  const DLDevice mem{cuda ? kDLCUDAHost : kDLCPU, 0};
  for (int i = 0; i < kBuffers; ++i) {
    raw[i] = sdk::Buffer(host, mem, block_bytes + kDirectAlign, TSR_MEM_OPTIMIZER);
    const auto p = reinterpret_cast<uintptr_t>(raw[i].get());
    buf[i] = reinterpret_cast<char *>(align_up(p, kDirectAlign));
  }
  if (on_disk())
    for (int i = 0; i < kBuffers; ++i) {
      fetch_raw[i] = sdk::Buffer(host, mem, params_region() + kDirectAlign, TSR_MEM_PARAMS);
      const auto p = reinterpret_cast<uintptr_t>(fetch_raw[i].get());
      fetch_buf[i] = reinterpret_cast<char *>(align_up(p, kDirectAlign));
    }
  if (on_disk()) cache.init(host, mem, cache_slots, params_region(), cuda);
  open_file(this);
  fetch_io.fd = io.fd;
  fetch_io.name = io.name;
  const int ring_err = io.init_ring();
  if (!ring_err && on_disk()) (void)fetch_io.init_ring();  // else blocking reads
  if (ring_err) {
    const std::string w =
        fmt("%s: io_uring is not available (%s); reading and writing with "
            "blocking pread / pwrite, without overlap",
            kWho, std::strerror(ring_err));
    host->log(host->ctx, TSR_LOG_WARN, w.c_str());
  }
  const unsigned threads =
      threads_cfg > 0 ? static_cast<unsigned>(threads_cfg) : default_threads(host);
  pool = std::make_unique<ThreadPool>(threads);
  double staging = kBuffers * double(block_bytes);
  if (on_disk()) staging += kBuffers * double(params_region()) + double(cache.bytes());
  if (home_host) {
    home_buf = sdk::Buffer(host, mem, std::max<size_t>(n, 1) * cb, TSR_MEM_PARAMS);
    home.init(kWho, n, compute_dtype, home_buf.as<char>(), cuda, st->device.device_id);
  }
#if TSR_PLUGIN_CUDA
  if (cuda) {
    copies.init(kWho);
    for (auto &e : fetch_ev) e = make_event(kWho);
    for (auto &e : fetch_end) e = make_event(kWho);
    grads_stage = sdk::Buffer(host, mem, block * cb, TSR_MEM_OTHER);
    for (auto &b : params_stage) b = sdk::Buffer(host, mem, block * cb, TSR_MEM_OTHER);
    grads_ev = make_event(kWho);
    for (auto &e : params_ev) e = make_event(kWho);
    staging += 3.0 * block * cb;
  }
#endif
  if (held) init_sink(this, mem);
  log_setup(this, threads, staging);
}

void Nvme::step(const tsr_offload_step *st) {
  check_range(st->offset, st->count);
  if (st->count == 0) return;
  // A new step's range: the last walk has ended by now (the host's
  // wait_grads came before this step's backward); join it.
  if (walker.joinable()) walk_settle(this);
  Pending p;
  p.offset = st->offset;
  p.count = st->count;
  p.grads = st->grads;
  p.params = st->params;
  p.segments.assign(st->segments, st->segments + st->num_segments);
  p.lr = st->lr;
  p.grad_scale = st->grad_scale;
  p.step = st->step;
  pending.push_back(std::move(p));
}

void Nvme::flush() {
  walk_settle(this);
#if TSR_PLUGIN_CUDA
  if (cuda) copies.finish();
#endif
}

// ABI 1.2: the host does not flush after handing the ranges over; the walk
// starts at the next forward's first call for parameters and runs beside it.
void Nvme::wait_params(size_t offset, size_t count) {
  check_range(offset, count);
  if (overlap)
    walk_wait(this, offset, count);
  else
    walk_settle(this);
#if TSR_PLUGIN_CUDA
  // Parameters on the device: the walk copied the updated blocks up on
  // the copy stream through two stages; the compute stream waits for
  // each stage's latest copy, which is this range's or one queued after
  // it on the same stream.
  if (cuda && params_where == TSR_PARAMS_ON_DEVICE)
    for (cudaEvent_t e : params_ev)
      cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(host->compute_stream), e, 0), kWho,
                 "wait for the updated parameters' copy");
#endif
}

// For the run's breakdown: the CPU step's seconds and elements so far (the
// disk's time is not a copy between devices: d2h and h2d stay 0).
void Nvme::stats(tsr_offload_stats *out) {
  if (!out || out->struct_size < tsr_offload_stats_STRUCT_SIZE)
    throw Error(TSR_ERR_INVALID, fmt("%s: stats struct missing or too small", kWho));
  tsr_offload_stats st{};
  st.host_s = update_s.load();
  st.elements = elements_updated.load();
  sdk::copy_out(st, out);
}

// The walk has read every gradient handed over (it copies device gradients
// to the host and waits for each copy): the host may clear them.
void Nvme::wait_grads() {
  walk_settle(this);
}

void Nvme::read_state(uint32_t slot, size_t offset, size_t count, float *dst) {
  copy_state(this, slot, offset, count, dst, nullptr);
}

void Nvme::write_state(uint32_t slot, size_t offset, size_t count, const float *src) {
  copy_state(this, slot, offset, count, nullptr, src);
}

}  // namespace tessera::offload::nvme

namespace {

const tsr_param_decl kParams[] = {
    sdk::param("path", TSR_PARAM_STRING, "\"\"",
               "directory for the state files (one per rank, rank<R>.state), on a fast local "
               "disk; created if missing, the files removed at the end"),
    kThreadsParam,
    sdk::param_min("sub_group_size", TSR_PARAM_INT, "4194304",
                   "elements per block streamed through each of the three buffers (rounded up "
                   "to a multiple of 1024)",
                   1024),
    sdk::param("overlap", TSR_PARAM_BOOL, "true",
               "run the update's walk over the blocks beside the next forward, which waits "
               "only for the blocks it needs; false: the forward waits for the whole walk"),
    sdk::param_min("param_cache", TSR_PARAM_INT, "16",
                   "params = \"nvme\": blocks whose parameters stay in host memory (pinned on "
                   "CUDA) after the walk writes them, so the next forward's fetches, which "
                   "trail the walk, skip the disk for them; 0: none",
                   0),
    sdk::param("params", TSR_PARAM_STRING, "\"none\"",
               "ZeRO stage 3: where this rank's compute parameters live, \"none\" (the GPU), "
               "\"cpu\" (host memory) or \"nvme\" (the state file); each group's slice is "
               "fetched just before use (DeepSpeed's offload_param)"),
};

const tsr_offload_vtable kVtable = sdk::offload_vtable<Nvme, build>();

const tsr_plugin_descriptor kNvme = sdk::describe(TSR_KIND_OFFLOAD, "nvme", "1.2.0", kSummary,
                                                  kParams, kDevices, &kVtable, get_extension);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kNvme)
