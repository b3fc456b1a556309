#include "data/loader.hpp"

#include <algorithm>
#include <cstring>

#include "util/error.hpp"
#include "util/trace.hpp"
#ifdef TESSERA_HAVE_CUDA
#include "backend/cuda/device.hpp"
#include "backend/cuda/known_ids.hpp"
#endif

namespace tessera {

size_t dtype_bytes(const DLDataType &t) {
  return (t.bits * t.lanes + 7) / 8;
}

Loader::Loader(Host &host, const tsr_dataset_vtable *vt, void *dataset, const tsr_data_info &info,
               std::vector<int64_t> indices, int64_t batch_size, bool keep_partial, int workers,
               int prefetch, std::string name)
    : host_(host),
      vt_(vt),
      dataset_(dataset),
      info_(info),
      indices_(std::move(indices)),
      batch_size_(batch_size),
      name_(std::move(name)),
      span_name_("load batch (" + name_ + ")") {
  TSR_CHECK(batch_size_ > 0, TSR_ERR_INVALID, "loader: batch size must be positive");
  int64_t n = static_cast<int64_t>(indices_.size());
  num_batches_ = keep_partial ? (n + batch_size_ - 1) / batch_size_ : n / batch_size_;
  size_t in_elems = 1, tgt_elems = 1;
  for (int i = 0; i < info_.input_ndim; ++i) in_elems *= static_cast<size_t>(info_.input_shape[i]);
  for (int i = 0; i < info_.target_ndim; ++i)
    tgt_elems *= static_cast<size_t>(info_.target_shape[i]);
  in_bytes_ = in_elems * dtype_bytes(info_.input_dtype);
  tgt_bytes_ = tgt_elems * dtype_bytes(info_.target_dtype);
  // Packed sequences (ABI 1.8): an int32 position per input element. The
  // session's info is zeroed at its full size before the dataset fills it,
  // so a dataset of an older minor leaves positions 0.
  if (info_.positions) pos_bytes_ = in_elems * sizeof(int32_t);
  // workers == 0 reads on the calling thread, inside next().
  int nslots = std::max(1, prefetch + std::max(workers, 0));
  slots_.resize(static_cast<size_t>(nslots));
  on_device_ = host_.facts().device.device_type == kDLCUDA;
  // Pinned host memory in CUDA runs, so the copies to the GPU are async.
  DLDevice cpu{on_device_ ? kDLCUDAHost : kDLCPU, 0};
  for (auto &s : slots_) {
    s.inputs = host_.alloc(cpu, in_bytes_ * static_cast<size_t>(batch_size_), TSR_MEM_OTHER);
    s.targets = host_.alloc(cpu, tgt_bytes_ * static_cast<size_t>(batch_size_), TSR_MEM_OTHER);
    if (pos_bytes_)
      s.positions = host_.alloc(cpu, pos_bytes_ * static_cast<size_t>(batch_size_), TSR_MEM_OTHER);
    s.in_shape.assign(1, batch_size_);
    for (int i = 0; i < info_.input_ndim; ++i) s.in_shape.push_back(info_.input_shape[i]);
    s.tgt_shape.assign(1, batch_size_);
    for (int i = 0; i < info_.target_ndim; ++i) s.tgt_shape.push_back(info_.target_shape[i]);
  }
#ifdef TESSERA_HAVE_CUDA
  if (on_device_) {
    dev_.resize(2);
    for (auto &d : dev_) {
      d.inputs = host_.alloc(host_.facts().device, in_bytes_ * static_cast<size_t>(batch_size_),
                             TSR_MEM_ACTIVATIONS);
      d.targets = host_.alloc(host_.facts().device, tgt_bytes_ * static_cast<size_t>(batch_size_),
                              TSR_MEM_ACTIVATIONS);
      if (pos_bytes_)
        d.positions =
            host_.alloc(host_.facts().device, pos_bytes_ * static_cast<size_t>(batch_size_),
                        TSR_MEM_ACTIVATIONS);
      cudaEvent_t e1, e2;
      TSR_CUDA_CHECK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
      TSR_CUDA_CHECK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
      d.consumed = e1;
      d.copied = e2;
    }
  }
#endif
  for (int w = 0; w < workers; ++w) threads_.emplace_back([this, w] { worker(w); });
}

#ifdef TESSERA_HAVE_CUDA
namespace {

// Notes the value range of an int32 host tensor's first `bytes` as the
// range of its device copy `dev` (backend/cuda/known_ids.hpp): the embedding then
// needs no device check of ids the host has already seen. A scan of a
// batch's ids on the host costs microseconds; the device check it replaces
// costs a synchronisation of the step.
void note_ids(void *dev, const DLTensor &t, size_t bytes) {
  cuda::forget_int_range(dev);
  if (t.dtype.code != kDLInt || t.dtype.bits != 32 || t.dtype.lanes != 1) return;
  const auto *v = static_cast<const int32_t *>(t.data);
  const size_t n = bytes / sizeof(int32_t);
  if (n == 0) return;
  int32_t lo = v[0], hi = v[0];
  for (size_t i = 1; i < n; ++i) {
    lo = std::min(lo, v[i]);
    hi = std::max(hi, v[i]);
  }
  cuda::note_int_range(dev, bytes, lo, hi);
}

}  // namespace
#endif

const tsr_batch *Loader::to_device(const tsr_batch &b) {
#ifdef TESSERA_HAVE_CUDA
  DeviceSlot &d = dev_[static_cast<size_t>(dev_next_++ % static_cast<int64_t>(dev_.size()))];
  cudaStream_t copy = cuda::copy_stream(), compute = cuda::compute_stream();
  // The compute stream may still read this buffer's previous batch.
  TSR_CUDA_CHECK(cudaStreamWaitEvent(copy, static_cast<cudaEvent_t>(d.consumed), 0));
  const size_t n = static_cast<size_t>(b.size);
  // The inputs only: cross-entropy reads its check of the targets back with
  // the loss, in the one synchronisation it needs anyway.
  note_ids(d.inputs, b.inputs, n * in_bytes_);
  TSR_CUDA_CHECK(
      cudaMemcpyAsync(d.inputs, b.inputs.data, n * in_bytes_, cudaMemcpyHostToDevice, copy));
  TSR_CUDA_CHECK(
      cudaMemcpyAsync(d.targets, b.targets.data, n * tgt_bytes_, cudaMemcpyHostToDevice, copy));
  if (d.positions)
    TSR_CUDA_CHECK(cudaMemcpyAsync(d.positions, b.positions.data, n * pos_bytes_,
                                   cudaMemcpyHostToDevice, copy));
  TSR_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(d.copied), copy));
  TSR_CUDA_CHECK(cudaStreamWaitEvent(compute, static_cast<cudaEvent_t>(d.copied), 0));
  d.in_shape.assign(b.inputs.shape, b.inputs.shape + b.inputs.ndim);
  d.tgt_shape.assign(b.targets.shape, b.targets.shape + b.targets.ndim);
  d.batch = b;
  d.batch.inputs.data = d.inputs;
  d.batch.inputs.device = host_.facts().device;
  d.batch.inputs.shape = d.in_shape.data();
  d.batch.targets.data = d.targets;
  d.batch.targets.device = host_.facts().device;
  d.batch.targets.shape = d.tgt_shape.data();
  if (d.positions) {
    d.batch.positions.data = d.positions;
    d.batch.positions.device = host_.facts().device;
    d.batch.positions.shape = d.in_shape.data();
  }
  return &d.batch;
#else
  return &b;
#endif
}

// Called when the caller is done enqueueing work on the batch handed out
// last: the compute stream marks that buffer consumed, and the pinned slot
// may be refilled once its copy has landed.
void Loader::release_device() {
#ifdef TESSERA_HAVE_CUDA
  if (!on_device_ || dev_next_ == 0) return;
  DeviceSlot &d = dev_[static_cast<size_t>((dev_next_ - 1) % static_cast<int64_t>(dev_.size()))];
  TSR_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(d.consumed), cuda::compute_stream()));
  TSR_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(d.copied)));
#endif
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto &t : threads_) t.join();
#ifdef TESSERA_HAVE_CUDA
  if (on_device_) {
    // Copies may be in flight from the pinned slots, and the compute stream
    // may still read the device buffers.
    cudaStreamSynchronize(cuda::copy_stream());
    cudaStreamSynchronize(cuda::compute_stream());
    for (auto &d : dev_) {
      cuda::forget_int_range(d.inputs);
      host_.free(d.inputs);
      host_.free(d.targets);
      if (d.positions) host_.free(d.positions);
      cudaEventDestroy(static_cast<cudaEvent_t>(d.consumed));
      cudaEventDestroy(static_cast<cudaEvent_t>(d.copied));
    }
  }
#endif
  for (auto &s : slots_) {
    host_.free(s.inputs);
    host_.free(s.targets);
    if (s.positions) host_.free(s.positions);
  }
}

void Loader::fill(Slot &s, int64_t seq, int lane) {
  trace::Span span(trace::Stream::copy, span_name_.c_str(), -1, lane);
  int64_t begin = seq * batch_size_;
  int64_t n = std::min<int64_t>(batch_size_, static_cast<int64_t>(indices_.size()) - begin);
  s.in_shape[0] = n;
  s.tgt_shape[0] = n;
  tsr_batch &b = s.batch;
  std::memset(&b, 0, sizeof b);
  b.struct_size = tsr_batch_STRUCT_SIZE;
  b.size = n;
  b.inputs.data = s.inputs;
  b.inputs.device = DLDevice{kDLCPU, 0};
  b.inputs.ndim = static_cast<int32_t>(s.in_shape.size());
  b.inputs.dtype = info_.input_dtype;
  b.inputs.shape = s.in_shape.data();
  b.targets.data = s.targets;
  b.targets.device = DLDevice{kDLCPU, 0};
  b.targets.ndim = static_cast<int32_t>(s.tgt_shape.size());
  b.targets.dtype = info_.target_dtype;
  b.targets.shape = s.tgt_shape.data();
  if (s.positions) {  // int32, the inputs' shape
    b.positions.data = s.positions;
    b.positions.device = DLDevice{kDLCPU, 0};
    b.positions.ndim = b.inputs.ndim;
    b.positions.dtype = DLDataType{kDLInt, 32, 1};
    b.positions.shape = s.in_shape.data();
  }
  tsr_status st = vt_->read(dataset_, indices_.data() + begin, &b);
  if (st != TSR_OK)
    throw Error(st, "dataset [" + name_ + "] failed to read a batch: " + host_.last_error());
}

void Loader::worker(int w) {
  for (;;) {
    int64_t seq;
    Slot *slot;
    {
      std::unique_lock<std::mutex> lk(mu_);
      // Claim the next batch once its slot has been released by the consumer.
      cv_.wait(lk, [&] {
        if (stop_ || next_claim_ >= num_batches_) return true;
        Slot &s = slots_[static_cast<size_t>(next_claim_ % static_cast<int64_t>(slots_.size()))];
        return s.seq == -1;
      });
      if (stop_ || next_claim_ >= num_batches_) return;
      seq = next_claim_++;
      slot = &slots_[static_cast<size_t>(seq % static_cast<int64_t>(slots_.size()))];
      slot->seq = seq;
      slot->ready = false;
    }
    std::string err;
    try {
      fill(*slot, seq, w);
    } catch (const std::exception &e) {
      err = e.what();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      slot->ready = true;
      if (!err.empty() && error_.empty()) error_ = err;
    }
    cv_.notify_all();
  }
}

const tsr_batch *Loader::next() {
  if (on_device_) release_device();
  std::unique_lock<std::mutex> lk(mu_);
  // Release the slot handed out by the previous call.
  if (next_seq_ > 0) {
    Slot &prev = slots_[static_cast<size_t>((next_seq_ - 1) % static_cast<int64_t>(slots_.size()))];
    prev.seq = -1;
    prev.ready = false;
    cv_.notify_all();
  }
  if (next_seq_ >= num_batches_) return nullptr;
  int64_t seq = next_seq_++;
  Slot &s = slots_[static_cast<size_t>(seq % static_cast<int64_t>(slots_.size()))];
  if (threads_.empty()) {
    s.seq = seq;
    lk.unlock();
    fill(s, seq, 0);
    return on_device_ ? to_device(s.batch) : &s.batch;
  }
  cv_.wait(lk, [&] { return (s.seq == seq && s.ready) || !error_.empty(); });
  if (!error_.empty()) throw Error(TSR_ERR_IO, error_);
  if (on_device_) {
    lk.unlock();
    return to_device(s.batch);
  }
  return &s.batch;
}

}  // namespace tessera
