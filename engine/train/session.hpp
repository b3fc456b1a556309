// The plugins of a job, instantiated on one host, with the model's
// parameters laid out in flat buffers.
#pragma once

#include <tessera/tessera.h>

#include <memory>
#include <string>
#include <vector>

#include "host/host.hpp"
#include "train/job.hpp"
#include "train/layout.hpp"

namespace tessera {

// Throws Error with the host's last message when a plugin call fails.
void plugin_ok(Host &host, tsr_status s, const std::string &what);

// One live plugin instance of any kind.
template <typename VTable>
struct Instance {
  const VTable *vt = nullptr;
  void *self = nullptr;
  std::string name;
  Instance() = default;
  Instance(const Instance &) = delete;
  Instance &operator=(const Instance &) = delete;
  ~Instance() { reset(); }
  void reset() {
    if (vt && self) vt->destroy(self);
    self = nullptr;
  }
};

struct Session {
  Session(const Job &job, Host::RunFacts facts, bool training);
  ~Session();

  const Job &job;
  Host host;
  bool training;

  Instance<tsr_dataset_vtable> train_data, eval_data;
  tsr_data_info train_info{}, eval_info{};
  Instance<tsr_sampler_vtable> sampler;
  Instance<tsr_model_vtable> model;
  Instance<tsr_optimizer_vtable> optimizer;
  Instance<tsr_zero_vtable> zero;
  Instance<tsr_offload_vtable> offload;
  tsr_zero_plan plan{};

  Layout layout;
  float *params = nullptr;  // flat [layout.total], fp32 on CPU
  float *grads = nullptr;   // flat [layout.total]; NULL for a frozen model
  std::vector<int64_t> flat_shape;

  // A DLTensor view of parameter i (or its gradient).
  DLTensor param_view(size_t i, bool grad);
  DLTensor flat_view(float *base);

  bool has_eval() const { return eval_data.self != nullptr; }
  uint32_t state_count = 0;

 private:
  std::vector<std::vector<int64_t>> shapes_;
};

}  // namespace tessera
