// Sampler "distributed": torch.utils.data.DistributedSampler's semantics.
//
// For a dataset of N samples and W ranks:
//  - without drop_last every rank gets ceil(N / W) indices; the list is padded
//    to ceil(N / W) * W by repeating it from the start (as often as needed);
//  - with drop_last every rank gets floor(N / W) indices (torch's
//    ceil((N - W) / W) when N % W != 0) and the tail is dropped;
//  - rank r takes positions r, r + W, r + 2W, ... of that list.
// With shuffle = true the list is a permutation of 0..N-1 that depends only
// on (seed + epoch) (torch seeds its generator the same way), so every rank
// computes the same permutation. torch's generator cannot be reproduced, so
// the permutation is our own and documented: a xoshiro256** generator whose
// state is filled by splitmix64 from (seed + epoch) mod 2^64, driving a
// Fisher-Yates shuffle from the last position down (position i swaps with
// j = bounded(i + 1), where bounded(n) is Lemire's unbiased multiply-shift
// method on the generator's 64-bit outputs). With shuffle = false the
// indices match torch's exactly.
#include <tessera/sampler.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <tessera/cpp/sampler.hpp>
#include <vector>

namespace sdk = tessera::sdk;

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "Each rank takes every world-th index of an (optionally shuffled, padded or truncated) list, "
    "like torch's DistributedSampler.";

__extension__ typedef unsigned __int128 u128;

// splitmix64 (Steele, Lea, Flood 2014), used to seed xoshiro256**.
uint64_t splitmix64(uint64_t &x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256** 1.0 (Blackman, Vigna 2018).
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (auto &w : s_) w = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, n), n > 0, without bias (Lemire 2019).
  uint64_t bounded(uint64_t n) {
    u128 m = static_cast<u128>(next()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<u128>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

template <typename T>
std::vector<T> permutation(uint64_t n, uint64_t seed) {
  std::vector<T> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<T>(i);
  Xoshiro256 rng(seed);
  for (uint64_t i = n; i > 1; --i) {
    const uint64_t j = rng.bounded(i);
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

struct Sampler {
  static constexpr const char *kName = "distributed sampler";  // for messages
  const tsr_host *host = nullptr;
  bool shuffle = true;
  bool drop_last = false;

  int64_t epoch_size(const tsr_sampler_args *args) const;
  void indices(const tsr_sampler_args *args, int64_t *out) const;
};

struct Plan {
  uint64_t n = 0;         // dataset size
  uint64_t world = 1;     // world size
  uint64_t rank = 0;      // this rank
  uint64_t per_rank = 0;  // indices per rank
  uint64_t seed = 0;      // seed + epoch (mod 2^64)
};

Plan plan(const Sampler &s, const tsr_sampler_args *args) {
  if (!TSR_HAS_FIELD(args, tsr_sampler_args, seed))
    throw sdk::Error(TSR_ERR_INVALID, "distributed sampler: sampler args missing or too old");
  if (args->dataset_size < 0)
    throw sdk::Error(TSR_ERR_INVALID, "distributed sampler: dataset_size is negative (" +
                                          std::to_string(args->dataset_size) + ")");
  if (args->world_size == 0)
    throw sdk::Error(TSR_ERR_INVALID, "distributed sampler: world_size is 0");
  if (args->rank >= args->world_size)
    throw sdk::Error(TSR_ERR_INVALID, "distributed sampler: rank " + std::to_string(args->rank) +
                                          " is not below world_size " +
                                          std::to_string(args->world_size));
  Plan p;
  p.n = static_cast<uint64_t>(args->dataset_size);
  p.world = args->world_size;
  p.rank = args->rank;
  // torch: if drop_last and N % W != 0: ceil((N - W) / W), else ceil(N / W).
  // For N >= 0 the first is floor(N / W), and with N % W == 0 both agree.
  p.per_rank = s.drop_last ? p.n / p.world : (p.n + p.world - 1) / p.world;
  p.seed = args->seed + static_cast<uint64_t>(args->epoch);
  return p;
}

template <typename T>
void fill_shuffled(const Plan &p, int64_t *out) {
  const std::vector<T> perm = permutation<T>(p.n, p.seed);
  for (uint64_t k = 0; k < p.per_rank; ++k)
    out[k] = static_cast<int64_t>(perm[(p.rank + k * p.world) % p.n]);
}

std::unique_ptr<Sampler> build(const tsr_host *host, const tsr_config *cfg) {
  sdk::Config c(host, cfg);
  auto s = std::make_unique<Sampler>();
  s->host = host;
  s->shuffle = c.get_bool("shuffle");
  s->drop_last = c.get_bool("drop_last");
  return s;
}

int64_t Sampler::epoch_size(const tsr_sampler_args *args) const {
  return static_cast<int64_t>(plan(*this, args).per_rank);
}

void Sampler::indices(const tsr_sampler_args *args, int64_t *out) const {
  const Plan p = plan(*this, args);
  if (p.per_rank == 0) return;
  if (!out) throw sdk::Error(TSR_ERR_INVALID, "distributed sampler: out is NULL");
  if (!shuffle) {
    for (uint64_t k = 0; k < p.per_rank; ++k)
      out[k] = static_cast<int64_t>((p.rank + k * p.world) % p.n);
  } else if (p.n <= UINT32_MAX) {
    fill_shuffled<uint32_t>(p, out);
  } else {
    fill_shuffled<uint64_t>(p, out);
  }
}

const tsr_sampler_vtable kVtable = sdk::sampler_vtable<Sampler, build>();

const tsr_param_decl params[] = {
    sdk::param("shuffle", TSR_PARAM_BOOL, "true",
               "Visit the samples in a new order every epoch, from (run seed + epoch); the same "
               "order on every rank."),
    sdk::param("drop_last", TSR_PARAM_BOOL, "false",
               "Drop the tail so every rank gets floor(N / world) samples; otherwise pad by "
               "repeating samples so every rank gets ceil(N / world)."),
};

const tsr_plugin_descriptor kDescriptor = sdk::describe(TSR_KIND_SAMPLER, "distributed", "1.0.0",
                                                        kSummary, params, TSR_DEVICE_CPU, &kVtable);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kDescriptor)
