#include "comm/gloo_comm.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>
#include <future>

#include "util/error.hpp"
#include "util/trace.hpp"

namespace tessera {

namespace {

// Gloo's rendezvous Store interface over our TCP store.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(StoreClient &c, std::chrono::milliseconds timeout) : c_(c), timeout_(timeout) {}
  void set(const std::string &key, const std::vector<char> &data) override {
    c_.set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string &key) override {
    std::string v = c_.get(key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string> &keys) override { wait(keys, timeout_); }
  // Gloo's own timeout arrives as 0 from Debian's build; comm.timeout_s
  // governs the rendezvous instead.
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override {
    if (!c_.wait(keys, timeout_))
      throw Error(TSR_ERR_COMM, "Gloo rendezvous: peers did not arrive within " +
                                    std::to_string(timeout_.count() / 1000) +
                                    " s (comm.timeout_s)");
  }

 private:
  StoreClient &c_;
  std::chrono::milliseconds timeout_;
};

size_t numel(const DLTensor *t) {
  size_t n = 1;
  for (int32_t i = 0; i < t->ndim; ++i) n *= static_cast<size_t>(t->shape[i]);
  return n;
}

char *data_of(const DLTensor *t) {
  return static_cast<char *>(t->data) + t->byte_offset;
}

void check_cpu(const DLTensor *t, const char *op) {
  if (!t || !t->data) throw Error(TSR_ERR_INVALID, std::string(op) + ": NULL tensor");
  if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost)
    throw Error(TSR_ERR_UNSUPPORTED, std::string(op) + ": Gloo collectives take host memory");
  if (t->dtype.lanes != 1 ||
      !((t->dtype.code == kDLFloat && (t->dtype.bits == 32 || t->dtype.bits == 64)) ||
        (t->dtype.code == kDLInt && t->dtype.bits == 64)))
    throw Error(TSR_ERR_UNSUPPORTED,
                std::string(op) + ": Gloo collectives take float32, float64 or int64");
}

template <typename T>
void reduce_typed(gloo::AllreduceOptions &o, tsr_reduce_op op) {
  using Fn = void (*)(void *, const void *, const void *, size_t);
  switch (op) {
    case TSR_REDUCE_MAX:
      o.setReduceFunction(static_cast<Fn>(&gloo::max<T>));
      break;
    case TSR_REDUCE_MIN:
      o.setReduceFunction(static_cast<Fn>(&gloo::min<T>));
      break;
    default:
      o.setReduceFunction(static_cast<Fn>(&gloo::sum<T>));
      break;
  }
}

// In-place all-reduce of n elements at p; AVG divides the sum by the world.
void allreduce_raw(GlooComm &c, char *p, size_t n, DLDataType dt, tsr_reduce_op op) {
  gloo::AllreduceOptions o(c.context());
  o.setTimeout(c.timeout());
  if (dt.code == kDLFloat && dt.bits == 32) {
    o.setOutput(reinterpret_cast<float *>(p), n);
    reduce_typed<float>(o, op);
  } else if (dt.code == kDLFloat) {
    o.setOutput(reinterpret_cast<double *>(p), n);
    reduce_typed<double>(o, op);
  } else {
    o.setOutput(reinterpret_cast<int64_t *>(p), n);
    reduce_typed<int64_t>(o, op);
  }
  gloo::allreduce(o);
  if (op == TSR_REDUCE_AVG) {
    const double inv = 1.0 / c.world();
    if (dt.code == kDLFloat && dt.bits == 32) {
      auto *f = reinterpret_cast<float *>(p);
      for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(f[i] * inv);
    } else if (dt.code == kDLFloat) {
      auto *f = reinterpret_cast<double *>(p);
      for (size_t i = 0; i < n; ++i) f[i] *= inv;
    } else {
      auto *f = reinterpret_cast<int64_t *>(p);
      for (size_t i = 0; i < n; ++i) f[i] /= static_cast<int64_t>(c.world());
    }
  }
}

tsr_status do_all_reduce(GlooComm &c, tsr_host_ctx *ctx, DLTensor *t, tsr_reduce_op op,
                         tsr_comm_work **work) {
  return guarded(ctx, [&] {
    check_cpu(t, "all_reduce");
    char *p = data_of(t);
    size_t n = numel(t);
    DLDataType dt = t->dtype;
    tsr_status s = c.submit(
        ctx, "all_reduce",
        [&c, p, n, dt, op] {
          if (c.shm())
            c.shm()->all_reduce(p, n, dt, op);
          else
            allreduce_raw(c, p, n, dt, op);
        },
        work, static_cast<int64_t>(n * dt.bits / 8));
    if (s != TSR_OK) throw ReportedError(s);  // keep the detailed message
  });
}

tsr_status do_reduce_scatter(GlooComm &c, tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                             tsr_reduce_op op, tsr_comm_work **work) {
  return guarded(ctx, [&] {
    check_cpu(in, "reduce_scatter");
    check_cpu(out, "reduce_scatter");
    size_t n = numel(out), es = in->dtype.bits / 8;
    if (numel(in) != n * c.world())
      throw Error(TSR_ERR_INVALID, "reduce_scatter: input must hold world_size x output elements");
    const char *src = data_of(in);
    char *dst = data_of(out);
    DLDataType dt = in->dtype;
    // Gloo 0.5 has no options-based reduce-scatter: all-reduce a copy and
    // keep this rank's slice (twice the traffic of a ring reduce-scatter).
    tsr_status s = c.submit(
        ctx, "reduce_scatter",
        [&c, src, dst, n, es, dt, op] {
          if (c.shm()) return c.shm()->reduce_scatter(src, dst, n, dt, op);
          char *tmp = static_cast<char *>(c.scratch(n * c.world() * es));
          std::memcpy(tmp, src, n * c.world() * es);
          allreduce_raw(c, tmp, n * c.world(), dt, op);
          std::memcpy(dst, tmp + c.rank() * n * es, n * es);
        },
        work, static_cast<int64_t>(n * c.world() * es));
    if (s != TSR_OK) throw ReportedError(s);  // keep the detailed message
  });
}

tsr_status do_all_gather(GlooComm &c, tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                         tsr_comm_work **work) {
  return guarded(ctx, [&] {
    check_cpu(in, "all_gather");
    check_cpu(out, "all_gather");
    size_t n = numel(in), es = in->dtype.bits / 8;
    if (numel(out) != n * c.world())
      throw Error(TSR_ERR_INVALID, "all_gather: output must hold world_size x input elements");
    char *src = data_of(in);
    char *dst = data_of(out);
    tsr_status s = c.submit(
        ctx, "all_gather",
        [&c, src, dst, n, es] {
          if (c.shm()) return c.shm()->all_gather(src, dst, n * es);
          gloo::AllgatherOptions o(c.context());
          o.setTimeout(c.timeout());
          o.setInput(src, n * es);
          o.setOutput(dst, n * es * c.world());
          gloo::allgather(o);
        },
        work, static_cast<int64_t>(n * es * c.world()));
    if (s != TSR_OK) throw ReportedError(s);  // keep the detailed message
  });
}

tsr_status do_broadcast(GlooComm &c, tsr_host_ctx *ctx, DLTensor *t, uint32_t root,
                        tsr_comm_work **work) {
  return guarded(ctx, [&] {
    check_cpu(t, "broadcast");
    char *p = data_of(t);
    size_t bytes = numel(t) * t->dtype.bits / 8;
    tsr_status s = c.submit(
        ctx, "broadcast",
        [&c, p, bytes, root] {
          if (c.shm()) return c.shm()->broadcast(p, bytes, root);
          gloo::BroadcastOptions o(c.context());
          o.setTimeout(c.timeout());
          o.setRoot(static_cast<int>(root));
          o.setOutput(p, bytes);
          gloo::broadcast(o);
        },
        work, static_cast<int64_t>(bytes));
    if (s != TSR_OK) throw ReportedError(s);  // keep the detailed message
  });
}

tsr_status do_barrier(GlooComm &c, tsr_host_ctx *ctx) {
  return guarded(ctx, [&] {
    tsr_status s = c.submit(
        ctx, "barrier",
        [&c] {
          if (c.shm()) return c.shm()->barrier();
          gloo::BarrierOptions o(c.context());
          o.setTimeout(c.timeout());
          gloo::barrier(o);
        },
        nullptr);
    if (s != TSR_OK) throw ReportedError(s);  // keep the detailed message
  });
}

}  // namespace

struct GlooComm::Work {
  std::function<void()> fn;
  std::string name;
  int64_t seq = 0, bytes = -1;
  bool done = false;
  std::string error;
};

tsr_status GlooComm::all_reduce(tsr_host_ctx *ctx, DLTensor *t, tsr_reduce_op op,
                                tsr_comm_work **work) {
  return do_all_reduce(*this, ctx, t, op, work);
}
tsr_status GlooComm::reduce_scatter(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                                    tsr_reduce_op op, tsr_comm_work **work) {
  return do_reduce_scatter(*this, ctx, in, out, op, work);
}
tsr_status GlooComm::all_gather(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                                tsr_comm_work **work) {
  return do_all_gather(*this, ctx, in, out, work);
}
tsr_status GlooComm::broadcast(tsr_host_ctx *ctx, DLTensor *t, uint32_t root,
                               tsr_comm_work **work) {
  return do_broadcast(*this, ctx, t, root, work);
}
tsr_status GlooComm::barrier(tsr_host_ctx *ctx) {
  return do_barrier(*this, ctx);
}

GlooComm::GlooComm(StoreClient &store, uint32_t rank, uint32_t world, std::chrono::seconds timeout,
                   const std::string &iface, const std::string &hostname, const std::string &prefix,
                   bool shm)
    : store_(store), rank_(rank), world_(world), timeout_(timeout), prefix_(prefix) {
  gloo::transport::tcp::attr attr;
  if (!iface.empty())
    attr.iface = iface;
  else
    attr.hostname = hostname;
  std::shared_ptr<gloo::transport::Device> dev;
  try {
    dev = gloo::transport::tcp::CreateDevice(attr);
    GlooStore gs(store_, timeout_);
    gloo::rendezvous::PrefixStore ps(prefix_ + "/gloo", gs);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(rank),
                                                           static_cast<int>(world));
    ctx->setTimeout(timeout_);
    ctx->connectFullMesh(ps, dev);
    context_ = ctx;
    // Gloo stays connected either way: its context is also the fallback
    // path's, and connecting proves every rank reachable.
    std::string why = "comm.shm = false";
    if (shm && world > 1)
      shm_ = ShmGroup::open(store_, prefix_, rank, world, hostname, timeout_, &why);
    transport_ = world == 1 ? "none (one rank)"
                 : shm_     ? "shared memory (every rank on this host)"
                            : "Gloo TCP (no shared memory: " + why + ")";
  } catch (const Error &) {
    throw;
  } catch (const std::exception &e) {
    throw Error(TSR_ERR_COMM, std::string("rank ") + std::to_string(rank) +
                                  ": Gloo could not connect the ranks: " + e.what());
  }
  thread_ = std::thread([this] { loop(); });
  heartbeat_ = std::thread([this] { heartbeat(); });
}

void GlooComm::heartbeat() {
  // Publishes which collective this rank has reached, twice a second, so a
  // timed-out rank can name the peers that never arrived. Off the hot path:
  // a store round trip per collective would cost more than small ones.
  int64_t posted = -1;
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    int64_t now = current_seq_;
    if (now != posted) {
      lk.unlock();
      try {
        store_.set(prefix_ + "/seq/" + std::to_string(rank_), std::to_string(now));
        posted = now;
      } catch (const std::exception &) {
        return;  // the store is gone: the abort watch reports it
      }
      lk.lock();
    }
    hb_cv_.wait_for(lk, std::chrono::milliseconds(500), [&] { return stop_; });
  }
}

GlooComm::~GlooComm() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  hb_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void *GlooComm::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

std::string GlooComm::missing_ranks(int64_t seq) {
  // Every rank posts how many collectives it has started; those behind
  // `seq` never reached this one.
  std::string out;
  for (uint32_t r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    std::string v;
    int64_t theirs = store_.check(prefix_ + "/seq/" + std::to_string(r), &v)
                         ? std::strtoll(v.c_str(), nullptr, 10)
                         : 0;
    if (theirs < seq) out += (out.empty() ? "" : ", ") + std::to_string(r);
  }
  return out.empty() ? "none known (the peers arrived but the transfer failed)" : out;
}

// Collectives run one at a time in the order issued, on the communication
// thread, or on a caller that waits for one not yet started: it runs the
// queue up to its own instead of sleeping while the thread is woken (with
// as many ranks as cores, each hand-off is two context switches, ~10% of a
// small model's step on 2 cores).
void GlooComm::loop() {
  for (;;) {
    std::shared_ptr<Work> w;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return (stop_ && queue_.empty()) || (!queue_.empty() && !running_); });
      if (queue_.empty()) return;
      w = queue_.front();
      queue_.pop_front();
      running_ = true;
    }
    execute(*w);
  }
}

// Runs w, which the caller took off the queue (running_ set under mu_).
void GlooComm::execute(Work &w) {
  std::string err;
  if (!broken_.empty()) {
    err = "an earlier collective failed: " + broken_;
  } else
    try {
      // The heartbeat posts it (not a store round trip per collective).
      current_seq_ = w.seq;
      trace::Span span(trace::Stream::communication, w.name.c_str(), w.bytes);
      w.fn();
    } catch (const std::exception &e) {
      std::string what = e.what();
      bool timed_out =
          what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
      err = "rank " + std::to_string(rank_) + ": " + w.name + " (collective #" +
            std::to_string(w.seq) + ") " +
            (timed_out
                 ? "timed out after " + std::to_string(timeout_.count() / 1000) +
                       " s (comm.timeout_s); ranks that had not reached it: " + missing_ranks(w.seq)
                 : "failed: " + what);
    }
  {
    std::lock_guard<std::mutex> lk(mu_);
    w.done = true;
    w.error = err;
    running_ = false;
    // After a failure nothing later can succeed: the rest fail at once.
    if (!err.empty() && broken_.empty()) broken_ = err;
  }
  cv_.notify_all();
}

tsr_status GlooComm::submit(tsr_host_ctx *ctx, const char *name, std::function<void()> fn,
                            tsr_comm_work **work, int64_t bytes) {
  auto w = std::make_shared<Work>();
  w->fn = std::move(fn);
  w->name = name;
  w->bytes = bytes;
  {
    std::lock_guard<std::mutex> lk(mu_);
    w->seq = ++seq_;
    queue_.push_back(w);
  }
  cv_.notify_all();
  if (work) {
    // The handle owns a reference until wait() releases it.
    *work = reinterpret_cast<tsr_comm_work *>(new std::shared_ptr<Work>(w));
    return TSR_OK;
  }
  return wait(ctx, reinterpret_cast<tsr_comm_work *>(new std::shared_ptr<Work>(w)));
}

tsr_status GlooComm::wait(tsr_host_ctx *ctx, tsr_comm_work *work) {
  if (!work) return TSR_OK;
  auto *holder = reinterpret_cast<std::shared_ptr<Work> *>(work);
  std::shared_ptr<Work> w = *holder;
  delete holder;
  // The time the caller spends blocked here is the breakdown's comm_wait
  // and a "wait" span on the caller's track; work already done costs none.
  const bool timed = trace::counting_waits() || trace::recording();
  const int64_t t0 = timed ? trace::now_ns() : 0;
  std::unique_lock<std::mutex> lk(mu_);
  // Not started yet, and nothing running: run the queue up to w here.
  while (!w->done && !running_ && !queue_.empty()) {
    std::shared_ptr<Work> next = queue_.front();
    queue_.pop_front();
    running_ = true;
    lk.unlock();
    execute(*next);
    lk.lock();
  }
  cv_.wait(lk, [&] { return w->done || !w->error.empty(); });
  if (timed) {
    lk.unlock();
    const int64_t t1 = trace::now_ns();
    if (trace::counting_waits()) trace::add_wait(t1 - t0);
    if (trace::recording())
      trace::record(
          trace::Event{"wait " + w->name, trace::Stream::compute, 0, t0, t1, -1, w->bytes});
    lk.lock();
  }
  if (!w->error.empty()) return report_error(ctx, TSR_ERR_COMM, w->error);
  return TSR_OK;
}

}  // namespace tessera
