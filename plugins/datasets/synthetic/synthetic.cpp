// Dataset "synthetic": random classification samples of any shape, for
// benchmarks and smoke tests that should not wait on a disk. A pool of
// `pool` distinct samples is drawn at create (a pure function of the seed):
// input values uniform in [-1, 1), and a label that depends on the input (a
// fixed projection, bucketed), so a model can actually learn it. Sample i is
// pool entry i mod pool: reading is a memcpy, fast enough to feed a GPU.
#include <tessera/dataset.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/dataset.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace sdk = tessera::sdk;

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "Random float32 inputs of any shape with learnable int32 class labels, computed per sample "
    "(no files): for benchmarks and smoke tests.";

struct Dataset {
  static constexpr const char *kName = "synthetic";  // for messages
  const tsr_host *host = nullptr;
  int64_t length = 0, classes = 0;
  std::vector<int64_t> shape;
  int64_t features = 1;
  uint64_t seed = 0;
  int64_t pool = 0;
  std::vector<float> inputs;     // pool x features
  std::vector<int32_t> targets;  // pool

  void info(tsr_data_info *out) const;
  void read(const int64_t *indices, tsr_batch *out) const;
};

// splitmix64: cheap, well-mixed, stateless per element.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::unique_ptr<Dataset> build(const tsr_host *host, const tsr_config *cfg, const char *split) {
  sdk::Config c(host, cfg);
  auto ds = std::make_unique<Dataset>();
  ds->host = host;
  ds->length = c.get_int("samples");
  ds->classes = c.get_int("classes");
  ds->shape = c.get_int_array("shape");
  const std::string where = std::string("synthetic: [data.") + (split ? split : "?") + "] ";
  if (ds->shape.empty() || ds->shape.size() > 8)
    throw sdk::Error(TSR_ERR_CONFIG, where + "shape needs 1 to 8 dims");
  for (int64_t d : ds->shape) {
    if (d < 1) throw sdk::Error(TSR_ERR_CONFIG, where + "shape has a dim below 1");
    ds->features *= d;
  }
  // Train and eval draw different samples from the same rule.
  ds->seed = mix(static_cast<uint64_t>(c.get_int("seed")) ^
                 (std::string(split ? split : "") == "eval" ? 0x5eedULL : 0));
  ds->pool = std::min<int64_t>(ds->length, c.get_int("pool"));
  const size_t f = static_cast<size_t>(ds->features);
  ds->inputs.resize(static_cast<size_t>(ds->pool) * f);
  ds->targets.resize(static_cast<size_t>(ds->pool));
  for (int64_t i = 0; i < ds->pool; ++i) {
    const uint64_t base = mix(ds->seed ^ static_cast<uint64_t>(i));
    float *row = ds->inputs.data() + static_cast<size_t>(i) * f;
    // Label: which of `classes` buckets a fixed projection of the input
    // falls in (the first 16 features, alternating signs).
    double proj = 0;
    for (size_t j = 0; j < f; ++j) {
      const uint64_t r = mix(base + j);
      row[j] =
          static_cast<float>(static_cast<double>(r >> 40) / static_cast<double>(1 << 23) - 1.0);
      if (j < 16) proj += (j & 1 ? -row[j] : row[j]);
    }
    // proj lies in (-16, 16) and concentrates near 0: spread +-8 over the classes.
    int64_t k = static_cast<int64_t>((proj / 8.0 + 1.0) * 0.5 * static_cast<double>(ds->classes));
    ds->targets[static_cast<size_t>(i)] =
        static_cast<int32_t>(k < 0 ? 0 : (k >= ds->classes ? ds->classes - 1 : k));
  }
  return ds;
}

void Dataset::info(tsr_data_info *out) const {
  out->length = length;
  out->input_dtype = sdk::dtype_f32();
  out->input_ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) out->input_shape[i] = shape[i];
  out->target_dtype = DLDataType{kDLInt, 32, 1};
  out->target_ndim = 0;
  out->num_classes = classes;
}

void Dataset::read(const int64_t *indices, tsr_batch *out) const {
  auto *x =
      reinterpret_cast<float *>(static_cast<char *>(out->inputs.data) + out->inputs.byte_offset);
  auto *y = reinterpret_cast<int32_t *>(static_cast<char *>(out->targets.data) +
                                        out->targets.byte_offset);
  const size_t f = static_cast<size_t>(features);
  for (int64_t i = 0; i < out->size; ++i) {
    if (indices[i] < 0 || indices[i] >= length)
      throw sdk::Error(TSR_ERR_INVALID,
                       "synthetic: sample index " + std::to_string(indices[i]) + " out of range");
    const size_t k = static_cast<size_t>(indices[i] % pool);
    std::memcpy(x + static_cast<size_t>(i) * f, inputs.data() + k * f, f * sizeof(float));
    y[i] = targets[k];
  }
}

const tsr_dataset_vtable kVtable = sdk::dataset_vtable<Dataset, build>();

const tsr_param_decl params[] = {
    sdk::param_min("samples", TSR_PARAM_INT, "65536", "samples in the dataset", 1),
    sdk::param("shape", TSR_PARAM_INT_ARRAY, "[784]", "shape of one input sample"),
    sdk::param_min("classes", TSR_PARAM_INT, "10", "number of classes", 2),
    sdk::param_min("seed", TSR_PARAM_INT, "0", "seed of the values (eval draws other samples)", 0),
    sdk::param_min("pool", TSR_PARAM_INT, "4096",
                   "distinct samples drawn at start; sample i is entry i mod pool", 1),
};

const tsr_plugin_descriptor kDescriptor = sdk::describe(TSR_KIND_DATASET, "synthetic", "1.0.0",
                                                        kSummary, params, TSR_DEVICE_CPU, &kVtable);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kDescriptor)
