// Batches from a dataset plugin, prepared ahead of the step by worker
// threads (data.workers) into a ring of host buffers (data.prefetch deep),
// handed out in order.
#pragma once

#include <tessera/dataset.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host/host.hpp"

namespace tessera {

struct LoadedBatch {
  tsr_batch batch{};
  int64_t seq = -1;
};

class Loader {
 public:
  // Serves `indices` in order as batches of `batch_size` (the last one may
  // be smaller when `keep_partial`, else it is dropped). In CUDA runs the
  // host buffers are pinned and next() hands out the batch on the GPU,
  // copied on the copy stream while the GPU still works on earlier steps.
  Loader(Host &host, const tsr_dataset_vtable *vt, void *dataset, const tsr_data_info &info,
         std::vector<int64_t> indices, int64_t batch_size, bool keep_partial, int workers,
         int prefetch, std::string name);
  ~Loader();
  Loader(const Loader &) = delete;
  Loader &operator=(const Loader &) = delete;

  // The next batch, valid until the following call; nullptr at the end.
  // Throws the dataset's error if reading failed.
  const tsr_batch *next();

 private:
  struct Slot {
    void *inputs = nullptr, *targets = nullptr;
    void *positions = nullptr;  // int32 like the inputs, where the dataset gives positions
    std::vector<int64_t> in_shape, tgt_shape;
    tsr_batch batch{};
    int64_t seq = -1;  // batch number held, -1 when free
    bool ready = false;
  };
  void worker(int w);
  void fill(Slot &slot, int64_t seq, int lane);
  // CUDA runs: copies `b` into the next device buffer; returns the device batch.
  const tsr_batch *to_device(const tsr_batch &b);
  void release_device();

  // Device copies of batches (CUDA runs): two buffers used in turn; an
  // event per buffer says the compute stream is done with it, another that
  // its copy has landed (so the pinned slot may be refilled).
  struct DeviceSlot {
    void *inputs = nullptr, *targets = nullptr, *positions = nullptr;
    std::vector<int64_t> in_shape, tgt_shape;
    tsr_batch batch{};
    void *consumed = nullptr, *copied = nullptr;  // cudaEvent_t
  };
  bool on_device_ = false;
  std::vector<DeviceSlot> dev_;
  int64_t dev_next_ = 0;

  Host &host_;
  const tsr_dataset_vtable *vt_;
  void *dataset_;
  tsr_data_info info_;
  std::vector<int64_t> indices_;
  int64_t batch_size_, num_batches_;
  std::string name_;
  std::string span_name_;                // "load batch (data.train)" on the trace's copy track
  size_t in_bytes_ = 0, tgt_bytes_ = 0;  // per sample
  size_t pos_bytes_ = 0;                 // per sample: int32 positions (ABI 1.8), 0 for none

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;
  int64_t next_seq_ = 0;    // next batch handed to next()
  int64_t next_claim_ = 0;  // next batch a worker claims
  bool stop_ = false;
  std::string error_;
};

size_t dtype_bytes(const DLDataType &t);

}  // namespace tessera
