#include "comm/nccl_comm.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "comm/nccl_comm_internal.hpp"
#include "comm/store.hpp"
#include "util/error.hpp"

namespace tessera {

using namespace nccl_detail;

namespace {

size_t numel(const DLTensor *t) {
  size_t n = 1;
  for (int32_t i = 0; i < t->ndim; ++i) n *= static_cast<size_t>(t->shape[i]);
  return n;
}

void *data_of(const DLTensor *t) {
  return static_cast<char *>(t->data) + t->byte_offset;
}

bool contiguous(const DLTensor *t) {
  if (!t->strides) return true;
  int64_t expect = 1;
  for (int32_t i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expect) return false;
    expect *= t->shape[i];
  }
  return true;
}

std::string dtype_name(DLDataType dt) {
  const char *code = dt.code == kDLFloat    ? "float"
                     : dt.code == kDLBfloat ? "bfloat"
                     : dt.code == kDLInt    ? "int"
                     : dt.code == kDLUInt   ? "uint"
                                            : "type";
  return code + std::to_string(dt.bits) + (dt.lanes != 1 ? "x" + std::to_string(dt.lanes) : "");
}

ncclDataType_t nccl_type(DLDataType dt, const char *op) {
  if (dt.lanes == 1) {
    if (dt.code == kDLFloat && dt.bits == 32) return ncclFloat32;
    if (dt.code == kDLFloat && dt.bits == 16) return ncclFloat16;
    if (dt.code == kDLFloat && dt.bits == 64) return ncclFloat64;
    if (dt.code == kDLBfloat && dt.bits == 16) return ncclBfloat16;
    if (dt.code == kDLInt && dt.bits == 32) return ncclInt32;
    if (dt.code == kDLInt && dt.bits == 64) return ncclInt64;
    if (dt.code == kDLInt && dt.bits == 8) return ncclInt8;
    if (dt.code == kDLUInt && dt.bits == 8) return ncclUint8;
  }
  throw Error(TSR_ERR_UNSUPPORTED,
              std::string(op) + ": NCCL collectives take float32, bfloat16, float16, float64, " +
                  "int32, int64, int8 or uint8, not " + dtype_name(dt));
}

ncclRedOp_t nccl_op(tsr_reduce_op op, const char *name) {
  switch (op) {
    case TSR_REDUCE_SUM:
      return ncclSum;
    case TSR_REDUCE_AVG:
      return ncclAvg;
    case TSR_REDUCE_MAX:
      return ncclMax;
    case TSR_REDUCE_MIN:
      return ncclMin;
    default:
      throw Error(TSR_ERR_INVALID, std::string(name) + ": unknown reduce op " + std::to_string(op));
  }
}

void check_tensor(const DLTensor *t, const char *op) {
  if (!t || (!t->data && numel(t) != 0))
    throw Error(TSR_ERR_INVALID, std::string(op) + ": NULL tensor");
  if (t->device.device_type != kDLCUDA)
    throw Error(TSR_ERR_UNSUPPORTED, std::string(op) + ": NCCL collectives take GPU memory");
  if (t->device.device_id != cuda::current_device())
    throw Error(TSR_ERR_INVALID,
                std::string(op) + ": tensor on GPU " + std::to_string(t->device.device_id) +
                    ", but this process drives GPU " + std::to_string(cuda::current_device()));
  if (!contiguous(t)) throw Error(TSR_ERR_INVALID, std::string(op) + ": tensor not contiguous");
}

size_t elem_bytes(DLDataType dt) {
  return static_cast<size_t>(dt.bits) * dt.lanes / 8;
}

// The job's NCCL unique id: rank 0 makes it and posts it under `key`; the
// others wait for it there.
ncclUniqueId share_unique_id(StoreClient &store, uint32_t rank, const std::string &key,
                             std::chrono::milliseconds timeout, const std::string &who) {
  ncclUniqueId id{};
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw Error(TSR_ERR_COMM, who + "NCCL could not make its unique id: " +
                                    ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")");
    store.set(key, std::string(id.internal, sizeof id.internal));
    return id;
  }
  if (!store.wait({key}, timeout))
    throw Error(TSR_ERR_COMM, who + "rank 0 did not publish the NCCL unique id within " +
                                  seconds(timeout) + " (comm.timeout_s)");
  const std::string v = store.get(key, timeout);
  if (v.size() != sizeof id.internal)
    throw Error(TSR_ERR_COMM, who + "the NCCL unique id in the store has " +
                                  std::to_string(v.size()) + " bytes, not " +
                                  std::to_string(sizeof id.internal));
  std::memcpy(id.internal, v.data(), v.size());
  return id;
}

// The ranks that never said they had started joining ("1, 3"), for a
// set-up that timed out.
std::string ranks_not_joined(StoreClient &store, const std::string &prefix, uint32_t world) {
  std::string missing;
  for (uint32_t q = 0; q < world; ++q) {
    std::string v;
    if (!store.check(prefix + "/nccl_join/" + std::to_string(q), &v))
      missing += (missing.empty() ? "" : ", ") + std::to_string(q);
  }
  return missing;
}

}  // namespace

NcclComm::NcclComm(StoreClient &store, uint32_t rank, uint32_t world, std::chrono::seconds timeout,
                   const std::string &prefix)
    : store_(store), rank_(rank), world_(world), timeout_(timeout), prefix_(prefix) {
  if (cuda::current_device() < 0)
    throw Error(TSR_ERR_INVALID,
                "NCCL: select the CUDA device (cuda::select_device) before joining the ranks");
  cuda::bind_thread();
  const std::string who = "rank " + std::to_string(rank_) + ": ";

  // The watchdog talks to the store on its own connection, so that a long
  // wait on the shared one (a start-up barrier) cannot hold it up.
  const std::string &ep = store_.endpoint();
  const auto colon = ep.rfind(':');
  watch_store_ = std::make_unique<StoreClient>(
      ep.substr(0, colon), static_cast<uint16_t>(std::stoi(ep.substr(colon + 1))), timeout_);

  // The unique id: rank 0 makes it, the others read it from the store.
  const ncclUniqueId id = share_unique_id(store_, rank_, prefix_ + "/nccl_id", timeout_, who);
  // Each rank says it has started joining, so a timeout can name the rest.
  store_.set(prefix_ + "/nccl_join/" + std::to_string(rank_), "1");

  // Non-blocking, so that a set-up that never completes can be aborted.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&comm_, static_cast<int>(world_), id,
                                          static_cast<int>(rank_), &config);
  const auto deadline = Clock::now() + timeout_;
  auto next_store = Clock::now();
  while (r == ncclInProgress) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
    if (r != ncclInProgress) break;
    if (Clock::now() >= next_store) {
      next_store = Clock::now() + kPollStore;
      const std::string why = peer_abort(*watch_store_);
      if (!why.empty()) {
        abort_comm();
        throw Error(TSR_ERR_COMM, "[comm] NCCL set-up stopped: " + why);
      }
    }
    if (Clock::now() >= deadline) {
      abort_comm();
      const std::string missing = ranks_not_joined(store_, prefix_, world_);
      throw Error(
          TSR_ERR_COMM,
          who + "[comm] NCCL set-up did not complete within " + seconds(timeout_) +
              " (comm.timeout_s); ranks that never joined: " +
              (missing.empty() ? "none (all joined; NCCL_DEBUG=INFO tells more)" : missing));
    }
  }
  if (r != ncclSuccess) {
    const std::string detail = comm_ ? ncclGetLastError(comm_) : "";
    abort_comm();
    throw Error(TSR_ERR_COMM, who + "NCCL set-up of " + std::to_string(world_) +
                                  " ranks failed: " + ncclGetErrorString(r) +
                                  (detail.empty() ? "" : " (" + detail + ")"));
  }

  TSR_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  scratch_ = cuda::device_alloc(sizeof(int32_t));
  TSR_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, sizeof(int32_t), cuda::comm_stream()));
  nccl_detail::watch_exit();
  watchdog_ = std::thread([this] { watchdog(); });
  monitor_ = std::thread([this] { monitor(); });
}

NcclComm::~NcclComm() {
  // Let the collectives in flight finish (the watchdog still guards them),
  // unless a rank has failed: then nothing more will complete.
  bool abort = aborted_.load();
  if (!abort && comm_) {
    try {
      cuda::bind_thread();
      auto next_store = Clock::now();
      for (;;) {
        cudaError_t q = cudaStreamQuery(cuda::comm_stream());
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
          (void)cudaGetLastError();
          abort = true;
          break;
        }
        if (Clock::now() >= next_store) {
          next_store = Clock::now() + kPollStore;
          std::string v;
          if (watch_store_->check(abort_key(prefix_), &v)) {
            abort = true;
            break;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } catch (const std::exception &) {
      abort = true;
    }
  }
  stop_ = true;
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (monitor_.joinable()) monitor_.join();
  if (!comm_) return;
  if (!abort) {
    // Finalise (flushes NCCL's own work), bounded; destroy only after it.
    ncclResult_t r = ncclCommFinalize(comm_);
    const auto deadline = Clock::now() + timeout_;
    while (r == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
    }
    abort = r != ncclSuccess;
  }
  if (abort) {
    abort_comm();
  } else {
    (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
  }
  if (ready_) (void)cudaEventDestroy(ready_);
  if (scratch_) cuda::device_free(scratch_);
}

ncclResult_t NcclComm::settle(ncclResult_t r, const std::string &what) {
  // A non-blocking communicator may return ncclInProgress while it is
  // still enqueuing; the kernel is on the stream only once the state is
  // ncclSuccess, so nothing is recorded behind it before then.
  const auto deadline = Clock::now() + timeout_;
  while (r == ncclInProgress) {
    if (Clock::now() >= deadline)
      fail("[comm] " + what + " could not be enqueued within " + seconds(timeout_) +
               " (comm.timeout_s)",
           kStoppedByPeerStatus);
    std::this_thread::yield();
    if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
  }
  return r;
}

std::shared_ptr<NcclComm::Op> NcclComm::launch(
    const char *name, int64_t bytes, tsr_comm_work **work,
    const std::function<ncclResult_t(cudaStream_t)> &call) {
  if (aborted_)
    throw Error(TSR_ERR_COMM, "rank " + std::to_string(rank_) + ": " + name +
                                  ": the NCCL communicator was aborted after an earlier failure");
  cuda::bind_thread();
  auto op = std::make_shared<Op>();
  op->name = name;
  op->bytes = bytes;
  TSR_CUDA_CHECK(cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming));
  cudaStream_t compute = cuda::compute_stream(), comm = cuda::comm_stream();
  {
    std::lock_guard<std::mutex> lk(mu_);
    op->seq = seq_ + 1;
    op->issued = Clock::now();
    // 1-2: the comm stream waits for everything queued on compute so far.
    TSR_CUDA_CHECK(cudaEventRecord(ready_, compute));
    TSR_CUDA_CHECK(cudaStreamWaitEvent(comm, ready_, 0));
    // 3: the collective.
    if (call) {
      ncclResult_t r = settle(call(comm), op->describe());
      if (r != ncclSuccess) {
        const bool usage = r == ncclInvalidArgument || r == ncclInvalidUsage;
        throw Error(usage ? TSR_ERR_INVALID : TSR_ERR_COMM,
                    "rank " + std::to_string(rank_) + ": " + op->describe() +
                        " failed: " + ncclGetErrorString(r) + " (" + ncclGetLastError(comm_) + ")");
      }
    }
    // 4: its completion.
    TSR_CUDA_CHECK(cudaEventRecord(op->done, comm));
    seq_ = op->seq;
    in_flight_.push_back(op);
    std::lock_guard<std::mutex> pk(pending_mu_);
    pending_.push_back({op->seq, op->issued, op->describe()});
  }
  if (work) {
    *work = reinterpret_cast<tsr_comm_work *>(new std::shared_ptr<Op>(op));
  } else {
    // Blocking call: later compute work sees the result.
    TSR_CUDA_CHECK(cudaStreamWaitEvent(compute, op->done, 0));
  }
  return op;
}

tsr_status NcclComm::all_reduce(tsr_host_ctx *ctx, DLTensor *t, tsr_reduce_op op,
                                tsr_comm_work **work) {
  if (work) *work = nullptr;
  return guarded(ctx, [&] {
    check_tensor(t, "all_reduce");
    const ncclDataType_t type = nccl_type(t->dtype, "all_reduce");
    const ncclRedOp_t red = nccl_op(op, "all_reduce");
    const size_t n = numel(t);
    void *p = data_of(t);
    launch(
        "all_reduce", static_cast<int64_t>(n * elem_bytes(t->dtype)), work,
        n == 0 ? std::function<ncclResult_t(cudaStream_t)>()
               : [&](cudaStream_t s) { return ncclAllReduce(p, p, n, type, red, comm_, s); });
  });
}

tsr_status NcclComm::reduce_scatter(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                                    tsr_reduce_op op, tsr_comm_work **work) {
  if (work) *work = nullptr;
  return guarded(ctx, [&] {
    check_tensor(in, "reduce_scatter");
    check_tensor(out, "reduce_scatter");
    const ncclDataType_t type = nccl_type(in->dtype, "reduce_scatter");
    if (nccl_type(out->dtype, "reduce_scatter") != type)
      throw Error(TSR_ERR_INVALID, "reduce_scatter: input is " + dtype_name(in->dtype) +
                                       " but output is " + dtype_name(out->dtype));
    const ncclRedOp_t red = nccl_op(op, "reduce_scatter");
    const size_t n = numel(out);
    if (numel(in) != n * world_)
      throw Error(TSR_ERR_INVALID, "reduce_scatter: input has " + std::to_string(numel(in)) +
                                       " elements; it must hold world_size (" +
                                       std::to_string(world_) + ") x output (" + std::to_string(n) +
                                       ")");
    const void *src = data_of(in);
    void *dst = data_of(out);
    launch(
        "reduce_scatter", static_cast<int64_t>(n * world_ * elem_bytes(in->dtype)), work,
        n == 0 ? std::function<ncclResult_t(cudaStream_t)>() : [&](cudaStream_t s) {
          return ncclReduceScatter(src, dst, n, type, red, comm_, s);
        });
  });
}

tsr_status NcclComm::all_gather(tsr_host_ctx *ctx, const DLTensor *in, DLTensor *out,
                                tsr_comm_work **work) {
  if (work) *work = nullptr;
  return guarded(ctx, [&] {
    check_tensor(in, "all_gather");
    check_tensor(out, "all_gather");
    const ncclDataType_t type = nccl_type(in->dtype, "all_gather");
    if (nccl_type(out->dtype, "all_gather") != type)
      throw Error(TSR_ERR_INVALID, "all_gather: input is " + dtype_name(in->dtype) +
                                       " but output is " + dtype_name(out->dtype));
    const size_t n = numel(in);
    if (numel(out) != n * world_)
      throw Error(TSR_ERR_INVALID, "all_gather: output has " + std::to_string(numel(out)) +
                                       " elements; it must hold world_size (" +
                                       std::to_string(world_) + ") x input (" + std::to_string(n) +
                                       ")");
    const void *src = data_of(in);
    void *dst = data_of(out);
    launch(
        "all_gather", static_cast<int64_t>(n * world_ * elem_bytes(in->dtype)), work,
        n == 0 ? std::function<ncclResult_t(cudaStream_t)>()
               : [&](cudaStream_t s) { return ncclAllGather(src, dst, n, type, comm_, s); });
  });
}

tsr_status NcclComm::broadcast(tsr_host_ctx *ctx, DLTensor *t, uint32_t root,
                               tsr_comm_work **work) {
  if (work) *work = nullptr;
  return guarded(ctx, [&] {
    check_tensor(t, "broadcast");
    if (root >= world_)
      throw Error(TSR_ERR_INVALID, "broadcast: root " + std::to_string(root) +
                                       " is not a rank of " + std::to_string(world_));
    const ncclDataType_t type = nccl_type(t->dtype, "broadcast");
    const size_t n = numel(t);
    void *p = data_of(t);
    launch(
        "broadcast", static_cast<int64_t>(n * elem_bytes(t->dtype)), work,
        n == 0 ? std::function<ncclResult_t(cudaStream_t)>() : [&](cudaStream_t s) {
          return ncclBroadcast(p, p, n, type, static_cast<int>(root), comm_, s);
        });
  });
}

tsr_status NcclComm::barrier(tsr_host_ctx *ctx) {
  return guarded(ctx, [&] {
    // A one-element all-reduce that the host waits for: every rank has
    // issued it, and (the comm stream being in order) everything before.
    // The watchdog ends the process if it never completes.
    tsr_comm_work *w = nullptr;
    auto op = launch("barrier", 0, &w, [&](cudaStream_t s) {
      return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, s);
    });
    delete reinterpret_cast<std::shared_ptr<Op> *>(w);  // the host waits, not the compute stream
    for (;;) {
      cudaError_t q = cudaEventQuery(op->done);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) TSR_CUDA_CHECK(q);
      if (aborted_)
        throw Error(TSR_ERR_COMM, "rank " + std::to_string(rank_) + ": " + op->describe() +
                                      ": the NCCL communicator was aborted");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    note_completed(op->seq);  // and so has everything before it
  });
}

void NcclComm::note_completed(int64_t seq) {
  // Collectives complete in order, so seeing one done means all before it
  // are; whoever sees it first (the watchdog, a barrier) moves the mark.
  int64_t cur = completed_.load();
  while (cur < seq && !completed_.compare_exchange_weak(cur, seq)) {
  }
}

tsr_status NcclComm::wait(tsr_host_ctx *ctx, tsr_comm_work *work) {
  if (!work) return TSR_OK;
  auto *holder = reinterpret_cast<std::shared_ptr<Op> *>(work);
  std::shared_ptr<Op> op = std::move(*holder);
  delete holder;
  return guarded(ctx, [&] {
    cuda::bind_thread();
    TSR_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), op->done, 0));
  });
}

}  // namespace tessera
