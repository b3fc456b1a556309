// Offload "cpu-bf16": a custom offload backend, written the way a user
// writes one (only the SDK headers; docs/writing-an-offload-backend.md walks
// through it). Like offload `cpu` it keeps the fp32 master weights in host
// memory and runs the optimizer's CPU step there, but it stores the
// optimizer's state arrays (Adam's exp_avg and exp_avg_sq, SGD's momentum)
// in bfloat16: 2 bytes instead of 4, so master + Adam state take 8 bytes
// per element instead of 12.
//
// The optimizer's step only knows fp32 state, so each update goes piece by
// piece (`piece` elements): widen the piece's state to fp32 scratch, call the
// optimizer's step on the piece (device kDLCPU) with the scratch as its
// state, round the scratch back to bf16 (round to nearest even). The master
// weights stay fp32, and the optimizer writes the compute copy of the
// parameters in the same pass as usual. Pieces are spread over `threads`
// threads.
//
// Rounding: round to nearest even, the same as torch's .to(torch.bfloat16).
// Stochastic rounding would keep tiny increments of the second moment from
// being rounded away (an update smaller than half a bf16 ulp of v is lost
// every time under RNE), at the price of a random stream per element and
// results that depend on the seed; the measured cost of RNE on the
// quickstart MLP is in the guide.
//
// In a CUDA run the gradients are copied to a host buffer through the
// host's ops->copy (on the compute stream, then synchronize) piece by piece
// and the compute parameters back the same way: simple, not pipelined
// (offload `cpu` overlaps copies with the update), and it needs no CUDA
// toolkit to build.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/half.hpp>
#include <tessera/cpp/offload.hpp>
#include <tessera/cpp/optimizer.hpp>
#include <tessera/cpp/plugin.hpp>
#include <thread>
#include <vector>

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "optimizer state in bf16 in host memory (half the bytes), step on the CPU";

namespace sdk = tessera::sdk;
using sdk::bf16_to_float;
using sdk::Error;
using sdk::float_to_bf16;
using sdk::optim::fmt;

constexpr const char *kWho = "offload cpu-bf16";

struct CpuBf16 {
  static constexpr const char *kName = kWho;  // for messages
  const tsr_host *host = nullptr;
  unsigned threads = 1;
  size_t piece = 0;  // elements widened to fp32 at a time, per thread

  size_t n = 0;  // owned elements
  const tsr_optimizer_vtable *opt = nullptr;
  void *opt_self = nullptr;
  uint32_t state_count = 0;
  bool cuda = false;
  DLDataType compute_dtype{};
  size_t compute_bytes = 4;

  sdk::Buffer master;                   // fp32, n elements
  std::vector<sdk::Buffer> state;       // bf16 (uint16_t), n elements each
  sdk::Buffer grads_host, params_host;  // CUDA runs: one piece of each, pinned

  uint16_t *state_at(uint32_t i) const { return state[i].as<uint16_t>(); }

  void setup(const tsr_offload_setup *st);
  void step(const tsr_offload_step *st);
  void flush();
  void check_state(uint32_t slot, size_t offset, size_t count) const;
  void read_state(uint32_t slot, size_t offset, size_t count, float *dst);
  void write_state(uint32_t slot, size_t offset, size_t count, const float *src);
};

// One update of owned elements [offset, offset + count) whose gradients and
// compute parameters are host memory (`grads`, `params` at `offset`).
struct Update {
  size_t offset = 0, count = 0;
  const char *grads = nullptr;
  char *params = nullptr;
  const tsr_segment *segments = nullptr;  // relative to offset
  size_t num_segments = 0;
  double lr = 0, grad_scale = 1;
  int64_t step = 0;
};

// Updates [begin, end) of `u` (relative to u.offset) piece by piece on this
// thread. Returns the optimizer's status.
tsr_status update_part(const CpuBf16 *s, const Update &u, size_t begin, size_t end) {
  const uint32_t k = s->state_count;
  std::vector<float> scratch(static_cast<size_t>(k) * s->piece);
  std::vector<float *> state(k);
  std::vector<tsr_segment> segs;
  for (size_t b = begin; b < end; b += s->piece) {
    const size_t e = std::min(end, b + s->piece), len = e - b;
    const size_t at = u.offset + b;  // owned element of the piece's first
    // Widen: bf16 -> fp32 is exact.
    for (uint32_t i = 0; i < k; ++i) {
      state[i] = scratch.data() + i * s->piece;
      const uint16_t *src = s->state_at(i) + at;
      for (size_t j = 0; j < len; ++j) state[i][j] = bf16_to_float(src[j]);
    }
    // The segments inside the piece, rebased to its first element.
    segs.clear();
    for (size_t q = 0; q < u.num_segments; ++q) {
      const size_t lo = std::max(u.segments[q].offset, b);
      const size_t hi = std::min(u.segments[q].offset + u.segments[q].count, e);
      if (lo < hi) segs.push_back(tsr_segment{lo - b, hi - lo, u.segments[q].decay});
    }
    auto a = sdk::make<tsr_optimizer_step_args>();
    a.device = DLDevice{kDLCPU, 0};
    a.params = s->master.as<float>() + at;
    a.grads = reinterpret_cast<const float *>(u.grads + b * s->compute_bytes);
    a.grads_dtype = s->compute_dtype;
    a.state = state.data();
    a.n = len;
    a.segments = segs.data();
    a.num_segments = segs.size();
    a.lr = u.lr;
    a.grad_scale = u.grad_scale;
    a.step = u.step;
    a.compute_params = u.params + b * s->compute_bytes;
    a.compute_dtype = s->compute_dtype;
    const tsr_status st = s->opt->step(s->opt_self, &a);
    if (st != TSR_OK) return st;
    // Narrow: fp32 -> bf16, round to nearest even.
    for (uint32_t i = 0; i < k; ++i) {
      uint16_t *dst = s->state_at(i) + at;
      for (size_t j = 0; j < len; ++j) dst[j] = float_to_bf16(state[i][j]);
    }
  }
  return TSR_OK;
}

// Splits `u` over the threads (boundaries on multiples of 32 elements, so
// no two threads write the same cache line of a bf16 array).
void update(const CpuBf16 *s, const Update &u) {
  const size_t parts =
      std::max<size_t>(1, std::min<size_t>(s->threads, (u.count + s->piece - 1) / s->piece));
  const size_t per = (u.count + parts - 1) / parts;
  auto bound = [&](size_t i) {
    return i >= parts ? u.count : std::min(u.count, (i * per + 31) / 32 * 32);
  };
  std::vector<tsr_status> status(parts, TSR_OK);
  std::vector<std::thread> pool;
  for (size_t i = 1; i < parts; ++i)
    pool.emplace_back([&, i] { status[i] = update_part(s, u, bound(i), bound(i + 1)); });
  status[0] = update_part(s, u, 0, bound(1));
  for (auto &t : pool) t.join();
  for (tsr_status st : status) sdk::check(st);  // the optimizer recorded its message
}

std::unique_ptr<CpuBf16> build(const tsr_host *host, const tsr_config *cfg) {
  sdk::Config c(host, cfg);
  auto s = std::make_unique<CpuBf16>();
  s->host = host;
  const int64_t t = c.get_int("threads");
  const uint32_t local = host->run ? std::max<uint32_t>(1, host->run->local_world_size) : 1;
  s->threads =
      t > 0 ? static_cast<unsigned>(t) : std::max(1u, std::thread::hardware_concurrency() / local);
  s->piece = static_cast<size_t>(c.get_int("piece"));
  return s;
}

void CpuBf16::setup(const tsr_offload_setup *st) {
  if (!TSR_HAS_FIELD(st, tsr_offload_setup, compute_dtype))
    throw Error(TSR_ERR_INVALID, fmt("%s: setup struct missing or too small", kWho));
  const int32_t dev = st->device.device_type;
  if (dev != kDLCPU && dev != kDLCUDA)
    throw Error(TSR_ERR_UNSUPPORTED, fmt("%s: device type %d is not supported", kWho, int(dev)));
  cuda = dev == kDLCUDA;
  if (cuda && !(TSR_HAS_FIELD(host, tsr_host, synchronize) && host->synchronize))
    throw Error(TSR_ERR_UNSUPPORTED, fmt("%s: a CUDA run needs tessera ABI 1.1 or later", kWho));
  n = st->n;
  opt = st->optimizer;
  opt_self = st->optimizer_self;
  state_count = st->state_count;
  compute_dtype = st->compute_dtype;
  compute_bytes = (st->compute_dtype.bits + 7) / 8;
  if (!cuda && compute_bytes != 4)
    throw Error(TSR_ERR_UNSUPPORTED, fmt("%s: CPU runs compute in float32", kWho));
  // Pinned host memory where there is a GPU (faster copies); plain
  // memory on a CPU run. Counted as optimizer state in the memory report.
  const DLDevice mem{cuda ? kDLCUDAHost : kDLCPU, 0};
  master = sdk::Buffer(host, mem, n * sizeof(float), TSR_MEM_OPTIMIZER);
  for (uint32_t i = 0; i < state_count; ++i)
    state.emplace_back(host, mem, n * sizeof(uint16_t), TSR_MEM_OPTIMIZER);
  if (cuda) {
    const size_t staged = std::min(n, piece * threads);
    grads_host = sdk::Buffer(host, mem, staged * compute_bytes, TSR_MEM_OTHER);
    params_host = sdk::Buffer(host, mem, staged * compute_bytes, TSR_MEM_OTHER);
  }
  const std::string msg =
      fmt("%s (rank %u): fp32 master weights (%.2f MiB) and %u optimizer state array%s in bf16 "
          "(%.2f MiB) of %zu owned elements in host memory: host %.2f MiB,%s disk 0 MiB; "
          "step on the CPU on %u thread(s)",
          kWho, host->run ? host->run->rank : 0u, n * 4.0 / 1048576.0, state_count,
          state_count == 1 ? "" : "s", state_count * n * 2.0 / 1048576.0, n,
          n * (4.0 + 2.0 * state_count) / 1048576.0, cuda ? " GPU 0 MiB," : "", threads);
  host->log(host->ctx, TSR_LOG_INFO, msg.c_str());
}

// A CUDA run: gradients to the host and parameters back through the host's
// copy op, one staging buffer's worth at a time.
void step_cuda(CpuBf16 *s, const tsr_offload_step *st) {
  const size_t staged = s->grads_host.bytes() / s->compute_bytes;
  for (size_t b = 0; b < st->count; b += staged) {
    const size_t len = std::min(staged, st->count - b);
    int64_t shape[1] = {static_cast<int64_t>(len)};
    const DLDevice cpu{kDLCPU, 0};
    auto *grads = const_cast<char *>(static_cast<const char *>(st->grads)) + b * s->compute_bytes;
    char *params = static_cast<char *>(st->params) + b * s->compute_bytes;
    DLTensor g_dev = sdk::view(grads, s->host->run->device, s->compute_dtype, 1, shape);
    DLTensor g_host = sdk::view(s->grads_host.get(), cpu, s->compute_dtype, 1, shape);
    DLTensor p_host = sdk::view(s->params_host.get(), cpu, s->compute_dtype, 1, shape);
    DLTensor p_dev = sdk::view(params, s->host->run->device, s->compute_dtype, 1, shape);
    // In stream order after the backward pass; the synchronize also ends
    // the previous piece's parameter copy, so both buffers are free.
    sdk::check(s->host->ops->copy(s->host->ctx, &g_dev, &g_host));
    sdk::check(s->host->synchronize(s->host->ctx));
    std::vector<tsr_segment> segs;
    for (size_t q = 0; q < st->num_segments; ++q) {
      const size_t lo = std::max(st->segments[q].offset, b);
      const size_t hi = std::min(st->segments[q].offset + st->segments[q].count, b + len);
      if (lo < hi) segs.push_back(tsr_segment{lo - b, hi - lo, st->segments[q].decay});
    }
    Update u;
    u.offset = st->offset + b;
    u.count = len;
    u.grads = s->grads_host.as<const char>();
    u.params = s->params_host.as<char>();
    u.segments = segs.data();
    u.num_segments = segs.size();
    u.lr = st->lr;
    u.grad_scale = st->grad_scale;
    u.step = st->step;
    update(s, u);
    sdk::check(s->host->ops->copy(s->host->ctx, &p_host, &p_dev));
  }
}

void CpuBf16::step(const tsr_offload_step *st) {
  if (st->offset > n || st->count > n - st->offset)
    throw Error(TSR_ERR_INVALID, fmt("%s: step range past the owned elements", kWho));
  if (cuda) return step_cuda(this, st);
  Update u;
  u.offset = st->offset;
  u.count = st->count;
  u.grads = static_cast<const char *>(st->grads);
  u.params = static_cast<char *>(st->params);
  u.segments = st->segments;
  u.num_segments = st->num_segments;
  u.lr = st->lr;
  u.grad_scale = st->grad_scale;
  u.step = st->step;
  update(this, u);
}

// CPU steps complete before they return; a CUDA run's last parameter copy
// may still be queued on the compute stream.
void CpuBf16::flush() {
  if (cuda) sdk::check(host->synchronize(host->ctx));
}

// Checkpoints and the initial master weights: slot 0 is the fp32 master,
// slot 1 + i state array i, widened to (or rounded from) fp32.
void CpuBf16::check_state(uint32_t slot, size_t offset, size_t count) const {
  if (offset > n || count > n - offset)
    throw Error(TSR_ERR_INVALID, fmt("%s: state range past the owned elements", kWho));
  if (slot > state_count) throw Error(TSR_ERR_INVALID, fmt("%s: no state slot %u", kWho, slot));
}

void CpuBf16::read_state(uint32_t slot, size_t offset, size_t count, float *dst) {
  check_state(slot, offset, count);
  if (slot == 0) {
    std::memcpy(dst, master.as<float>() + offset, count * sizeof(float));
    return;
  }
  const uint16_t *b = state_at(slot - 1) + offset;
  for (size_t i = 0; i < count; ++i) dst[i] = bf16_to_float(b[i]);
}

void CpuBf16::write_state(uint32_t slot, size_t offset, size_t count, const float *src) {
  check_state(slot, offset, count);
  if (slot == 0) {
    std::memcpy(master.as<float>() + offset, src, count * sizeof(float));
    return;
  }
  uint16_t *b = state_at(slot - 1) + offset;
  for (size_t i = 0; i < count; ++i) b[i] = float_to_bf16(src[i]);
}

const tsr_param_decl kParams[] = {
    sdk::param_min("threads", TSR_PARAM_INT, "0",
                   "threads for the CPU step; 0: the machine's cores / ranks on the machine", 0),
    sdk::param_min("piece", TSR_PARAM_INT, "16384",
                   "elements widened to fp32 scratch at a time, per thread", 32),
};

// Synchronous: no wait_params, wait_grads or stats, so its table ends at
// write_state (ABI 1.1) and the host flushes.
const tsr_offload_vtable kVtable = sdk::offload_vtable<CpuBf16, build>();

const tsr_plugin_descriptor kCpuBf16 =
    sdk::describe(TSR_KIND_OFFLOAD, "cpu-bf16", "1.0.0", kSummary, kParams,
                  TSR_DEVICE_CPU | TSR_DEVICE_CUDA, &kVtable);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kCpuBf16)
