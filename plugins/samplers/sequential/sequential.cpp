// Sampler "sequential": every sample exactly once, in order, for evaluation.
//
// The indices 0..N-1 are split into W contiguous blocks whose sizes differ
// by at most one, the larger ones first (numpy.array_split /
// torch.tensor_split): with q = N / W and m = N % W, rank r gets
// q + (r < m ? 1 : 0) indices starting at r * q + min(r, m). No padding and
// no shuffling, so the ranks together see each sample exactly once and a
// rank may get one index fewer than another (or none when N < W); the epoch
// and seed are ignored.
#include <tessera/sampler.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <tessera/cpp/plugin.hpp>

namespace sdk = tessera::sdk;

namespace {

struct Sampler {
  const tsr_host *host = nullptr;
};

struct Block {
  uint64_t begin = 0;
  uint64_t count = 0;
};

Block block(const tsr_sampler_args *args) {
  if (!TSR_HAS_FIELD(args, tsr_sampler_args, world_size))
    throw sdk::Error(TSR_ERR_INVALID, "sequential sampler: sampler args missing or too old");
  if (args->dataset_size < 0)
    throw sdk::Error(TSR_ERR_INVALID, "sequential sampler: dataset_size is negative (" +
                                          std::to_string(args->dataset_size) + ")");
  if (args->world_size == 0)
    throw sdk::Error(TSR_ERR_INVALID, "sequential sampler: world_size is 0");
  if (args->rank >= args->world_size)
    throw sdk::Error(TSR_ERR_INVALID, "sequential sampler: rank " + std::to_string(args->rank) +
                                          " is not below world_size " +
                                          std::to_string(args->world_size));
  const uint64_t n = static_cast<uint64_t>(args->dataset_size);
  const uint64_t w = args->world_size, r = args->rank;
  const uint64_t q = n / w, m = n % w;
  Block b;
  b.begin = r * q + std::min(r, m);
  b.count = q + (r < m ? 1 : 0);
  return b;
}

tsr_status create(const tsr_host *host, const tsr_config *, void **out_self) {
  return sdk::guard(host, [&] {
    if (!out_self) throw sdk::Error(TSR_ERR_INVALID, "sequential sampler: out_self is NULL");
    auto s = std::make_unique<Sampler>();
    s->host = host;
    *out_self = s.release();
  });
}

void destroy(void *self) {
  delete static_cast<Sampler *>(self);
}

tsr_status epoch_size(void *self, const tsr_sampler_args *args, int64_t *out) {
  auto *s = static_cast<Sampler *>(self);
  return sdk::guard(s->host, [&] {
    if (!out) throw sdk::Error(TSR_ERR_INVALID, "sequential sampler: out is NULL");
    *out = static_cast<int64_t>(block(args).count);
  });
}

tsr_status indices(void *self, const tsr_sampler_args *args, int64_t *out) {
  auto *s = static_cast<Sampler *>(self);
  return sdk::guard(s->host, [&] {
    const Block b = block(args);
    if (b.count == 0) return;
    if (!out) throw sdk::Error(TSR_ERR_INVALID, "sequential sampler: out is NULL");
    for (uint64_t k = 0; k < b.count; ++k) out[k] = static_cast<int64_t>(b.begin + k);
  });
}

const tsr_sampler_vtable vtable = {
    tsr_sampler_vtable_STRUCT_SIZE, create, destroy, epoch_size, indices,
};

const tsr_plugin_descriptor descriptor = {
    tsr_plugin_descriptor_STRUCT_SIZE,
    TSR_KIND_SAMPLER,
    "sequential",
    "1.0.0",
    "Every sample once, in order: rank r gets the r-th of W contiguous blocks whose sizes differ "
    "by at most one (no padding, no shuffle; for evaluation).",
    nullptr,
    0,
    TSR_DEVICE_CPU,
    &vtable,
    nullptr,  // get_extension (ABI 1.2): none
};

const tsr_plugin_descriptor *const plugins[] = {&descriptor};

const tsr_plugin_library library = {
    tsr_plugin_library_STRUCT_SIZE, TSR_ABI_MAJOR, TSR_ABI_MINOR, plugins, 1,
};

}  // namespace

TSR_PLUGIN_ENTRY {
  return &library;
}
