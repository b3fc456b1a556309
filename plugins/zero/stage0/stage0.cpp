// ZeRO stage 0: plain data parallelism. Every rank holds all parameters,
// gradients and optimizer state; gradients are averaged with an all-reduce
// per group, started as soon as a group's gradients of the last micro-batch
// are final so the reduction overlaps the rest of backward.
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace {

using namespace tessera::sdk;

struct Stage0 {
  const tsr_host *host = nullptr;
  std::vector<size_t> offset, size;
  size_t total = 0;
  DLTensor grads{};
  std::vector<int64_t> shapes;  // one shape per group, for the views
  std::vector<tsr_comm_work *> pending;
};

tsr_status create(const tsr_host *host, const tsr_config *, void **out) {
  return guard(host, [&] {
    auto *s = new Stage0();
    s->host = host;
    *out = s;
  });
}

void destroy(void *self) {
  delete static_cast<Stage0 *>(self);
}

tsr_status plan(void *self, tsr_zero_plan *out) {
  auto *s = static_cast<Stage0 *>(self);
  return guard(s->host, [&] {
    *out = make<tsr_zero_plan>();  // nothing partitioned
  });
}

tsr_status setup(void *self, const tsr_zero_setup *st) {
  auto *s = static_cast<Stage0 *>(self);
  return guard(s->host, [&] {
    s->offset.assign(st->group_offset, st->group_offset + st->num_groups);
    s->size.assign(st->group_size, st->group_size + st->num_groups);
    s->total = st->total;
    s->grads = st->grads;
    s->shapes.assign(st->num_groups, 0);
    for (size_t g = 0; g < st->num_groups; ++g) s->shapes[g] = static_cast<int64_t>(s->size[g]);
  });
}

tsr_status grads_done(void *self, uint32_t group, int32_t last_micro) {
  auto *s = static_cast<Stage0 *>(self);
  return guard(s->host, [&] {
    // Gradients accumulate locally over micro-batches; only the final sum
    // crosses the network.
    if (!last_micro || s->host->run->world_size == 1) return;
    if (group >= s->offset.size()) throw Error(TSR_ERR_INVALID, "stage0: group out of range");
    DLTensor g = s->grads;
    g.ndim = 1;
    g.shape = &s->shapes[group];
    g.strides = nullptr;
    g.byte_offset = s->grads.byte_offset + s->offset[group] * (s->grads.dtype.bits / 8);
    tsr_comm_work *work = nullptr;
    check(s->host->comm->all_reduce(s->host->ctx, &g, TSR_REDUCE_AVG, &work));
    if (work) s->pending.push_back(work);
  });
}

tsr_status finish_grads(void *self) {
  auto *s = static_cast<Stage0 *>(self);
  return guard(s->host, [&] {
    std::vector<tsr_comm_work *> pending;
    pending.swap(s->pending);
    for (auto *w : pending) check(s->host->comm->wait(s->host->ctx, w));
  });
}

tsr_status step(void *self, const tsr_zero_step *st) {
  auto *s = static_cast<Stage0 *>(self);
  return guard(s->host, [&] {
    // Every rank owns everything and updates identically: no re-sharing.
    for (size_t g = 0; g < s->offset.size(); ++g)
      check(st->update(st->update_ctx, s->offset[g], s->size[g]));
  });
}

const tsr_zero_vtable kVtable = {
    sizeof(tsr_zero_vtable), create, destroy, plan, setup, grads_done, finish_grads, step};

const tsr_plugin_descriptor kStage0 = {sizeof(tsr_plugin_descriptor),
                                       TSR_KIND_ZERO,
                                       "stage0",
                                       "1.0.0",
                                       "no partitioning: all-reduce gradients, replicate the rest",
                                       nullptr,
                                       0,
                                       TSR_DEVICE_CPU | TSR_DEVICE_CUDA,
                                       &kVtable};
const tsr_plugin_descriptor *const kPlugins[] = {&kStage0};
const tsr_plugin_library kLibrary = {sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR,
                                     kPlugins, 1};

}  // namespace

TSR_PLUGIN_ENTRY {
  return &kLibrary;
}
