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
#include <tessera/cpp/sampler.hpp>

namespace sdk = tessera::sdk;

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "Every sample once, in order: rank r gets the r-th of W contiguous blocks whose sizes differ "
    "by at most one (no padding, no shuffle; for evaluation).";

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

// No config, no state: the block follows from the args alone.
struct Sampler {
  static constexpr const char *kName = "sequential sampler";  // for messages
  const tsr_host *host = nullptr;

  int64_t epoch_size(const tsr_sampler_args *args) const {
    return static_cast<int64_t>(block(args).count);
  }
  void indices(const tsr_sampler_args *args, int64_t *out) const {
    const Block b = block(args);
    if (b.count == 0) return;
    if (!out) throw sdk::Error(TSR_ERR_INVALID, "sequential sampler: out is NULL");
    for (uint64_t k = 0; k < b.count; ++k) out[k] = static_cast<int64_t>(b.begin + k);
  }
};

std::unique_ptr<Sampler> build(const tsr_host *host, const tsr_config *) {
  auto s = std::make_unique<Sampler>();
  s->host = host;
  return s;
}

const tsr_sampler_vtable kVtable = sdk::sampler_vtable<Sampler, build>();

const tsr_plugin_descriptor kDescriptor =
    sdk::describe(TSR_KIND_SAMPLER, "sequential", "1.0.0", kSummary, {}, TSR_DEVICE_CPU, &kVtable);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kDescriptor)
