// Dataset "idx": images and labels in the IDX format of MNIST and
// Fashion-MNIST, plain or gzip-compressed, loaded into memory at create.
//
// Samples: input float32 [rows * cols], value (p * s - mean) / std for a
// pixel byte p, with s = 1/255 when normalize = true and 1 otherwise;
// target int32 class label. num_classes is the largest label in the labels
// file plus one. `limit` keeps the first N samples (0: all).
#include <tessera/dataset.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/dataset.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "idx_file.hpp"

namespace sdk = tessera::sdk;

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "MNIST-format (IDX) images and labels, plain or gzip, held in memory: float32 pixels "
    "(optionally scaled and standardised) and int32 class labels.";

std::string format_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

struct Dataset {
  static constexpr const char *kName = "idx";  // for messages
  const tsr_host *host = nullptr;
  std::string section;  // "[data.train]", for messages
  int64_t length = 0;
  int64_t rows = 0, cols = 0, features = 0;
  int64_t num_classes = 0;
  std::vector<uint8_t> pixels;  // length * features
  std::vector<uint8_t> labels;  // length
  float lut[256] = {};          // pixel byte -> input value

  void info(tsr_data_info *out) const;
  void read(const int64_t *indices, tsr_batch *out) const;
};

std::unique_ptr<Dataset> build(const tsr_host *host, const tsr_config *cfg, const char *split) {
  sdk::Config c(host, cfg);
  auto ds = std::make_unique<Dataset>();
  ds->host = host;
  ds->section = std::string("[data.") + (split ? split : "?") + "]";
  const std::string images_path = c.get_string("images");
  const std::string labels_path = c.get_string("labels");
  const bool normalize = c.get_bool("normalize");
  const double mean = c.get_float("mean");
  const double stddev = c.get_float("std");
  const int64_t limit = c.get_int("limit");
  if (images_path.empty())
    throw sdk::Error(TSR_ERR_CONFIG, "idx: " + ds->section + " images is empty");
  if (labels_path.empty())
    throw sdk::Error(TSR_ERR_CONFIG, "idx: " + ds->section + " labels is empty");
  if (!(stddev > 0.0))
    throw sdk::Error(TSR_ERR_CONFIG,
                     "idx: " + ds->section + " std must be > 0, got " + format_double(stddev));
  if (limit < 0)
    throw sdk::Error(TSR_ERR_CONFIG,
                     "idx: " + ds->section + " limit must be >= 0, got " + std::to_string(limit));

  tessera::idx::IdxArray images = tessera::idx::read_idx_u8(images_path, "images", 3);
  tessera::idx::IdxArray labels = tessera::idx::read_idx_u8(labels_path, "labels", 1);
  if (images.dims[0] != labels.dims[0])
    throw sdk::Error(TSR_ERR_INVALID, "idx: images file '" + images_path + "' holds " +
                                          std::to_string(images.dims[0]) +
                                          " images but labels file '" + labels_path + "' holds " +
                                          std::to_string(labels.dims[0]) + " labels");

  ds->rows = images.dims[1];
  ds->cols = images.dims[2];
  ds->features = ds->rows * ds->cols;
  const uint8_t max_label = *std::max_element(labels.data.begin(), labels.data.end());
  ds->num_classes = int64_t{max_label} + 1;

  int64_t n = images.dims[0];
  if (limit > 0 && limit < n) n = limit;
  ds->length = n;
  images.data.resize(static_cast<size_t>(n * ds->features));
  images.data.shrink_to_fit();
  labels.data.resize(static_cast<size_t>(n));
  labels.data.shrink_to_fit();
  ds->pixels = std::move(images.data);
  ds->labels = std::move(labels.data);

  const double scale = normalize ? 1.0 / 255.0 : 1.0;
  for (int p = 0; p < 256; ++p) ds->lut[p] = static_cast<float>((p * scale - mean) / stddev);

  if (host->log) {
    const std::string msg = "idx: " + ds->section + " " + std::to_string(n) + " samples of " +
                            std::to_string(ds->rows) + "x" + std::to_string(ds->cols) + ", " +
                            std::to_string(ds->num_classes) + " classes, from '" + images_path +
                            "'";
    host->log(host->ctx, TSR_LOG_INFO, msg.c_str());
  }
  return ds;
}

void Dataset::info(tsr_data_info *out) const {
  if (!TSR_HAS_FIELD(out, tsr_data_info, num_classes))
    throw sdk::Error(TSR_ERR_INVALID, "idx: info: output struct missing or too small");
  const size_t size = out->struct_size;
  auto d = sdk::make<tsr_data_info>();
  d.length = length;
  d.input_dtype = sdk::dtype_f32();
  d.input_ndim = 1;
  d.input_shape[0] = features;
  d.target_dtype = sdk::dtype_i32();
  d.target_ndim = 0;
  d.num_classes = num_classes;
  std::memcpy(out, &d, std::min(size, sizeof d));
  out->struct_size = size;
}

bool host_memory(const DLTensor &t) {
  return t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost;
}

bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

void check_tensor(const Dataset &ds, const DLTensor &t, const char *what, DLDataType dtype,
                  int32_t ndim, const int64_t *shape) {
  const std::string where = "idx: " + ds.section + " read: batch " + what;
  if (!host_memory(t)) throw sdk::Error(TSR_ERR_INVALID, where + " is not in host memory");
  if (!same_dtype(t.dtype, dtype))
    throw sdk::Error(TSR_ERR_INVALID, where + " has the wrong dtype (want " +
                                          (dtype.code == kDLFloat ? "float32" : "int32") + ")");
  bool ok = t.ndim == ndim && t.shape != nullptr;
  for (int32_t i = 0; ok && i < ndim; ++i) ok = t.shape[i] == shape[i];
  if (!ok) {
    std::string want = "[";
    for (int32_t i = 0; i < ndim; ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    throw sdk::Error(TSR_ERR_INVALID, where + " has the wrong shape (want " + want + "])");
  }
  if (t.strides) {
    int64_t expect = 1;
    for (int32_t i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && t.strides[i] != expect)
        throw sdk::Error(TSR_ERR_INVALID, where + " is not contiguous");
      expect *= shape[i];
    }
  }
  if (!t.data && shape[0] > 0) throw sdk::Error(TSR_ERR_INVALID, where + " has no data");
}

void Dataset::read(const int64_t *indices, tsr_batch *out) const {
  if (!TSR_HAS_FIELD(out, tsr_batch, targets))
    throw sdk::Error(TSR_ERR_INVALID, "idx: read: batch struct missing or too small");
  const int64_t n = out->size;
  if (n < 0)
    throw sdk::Error(TSR_ERR_INVALID,
                     "idx: " + section + " read: negative batch size " + std::to_string(n));
  if (n == 0) return;
  if (!indices) throw sdk::Error(TSR_ERR_INVALID, "idx: " + section + " read: no indices");
  const int64_t in_shape[2] = {n, features};
  const int64_t tg_shape[1] = {n};
  check_tensor(*this, out->inputs, "inputs", sdk::dtype_f32(), 2, in_shape);
  check_tensor(*this, out->targets, "targets", sdk::dtype_i32(), 1, tg_shape);
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= length)
      throw sdk::Error(TSR_ERR_INVALID, "idx: " + section + " read: sample index " +
                                            std::to_string(indices[i]) + " (batch position " +
                                            std::to_string(i) + ") is out of range [0, " +
                                            std::to_string(length) + ")");
  }
  auto *x =
      reinterpret_cast<float *>(static_cast<char *>(out->inputs.data) + out->inputs.byte_offset);
  auto *y = reinterpret_cast<int32_t *>(static_cast<char *>(out->targets.data) +
                                        out->targets.byte_offset);
  const size_t f = static_cast<size_t>(features);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t *src = pixels.data() + static_cast<size_t>(indices[i]) * f;
    float *dst = x + static_cast<size_t>(i) * f;
    for (size_t j = 0; j < f; ++j) dst[j] = lut[src[j]];
    y[i] = labels[static_cast<size_t>(indices[i])];
  }
}

const tsr_dataset_vtable kVtable = sdk::dataset_vtable<Dataset, build>();

const tsr_param_decl params[] = {
    sdk::param("images", TSR_PARAM_STRING, nullptr,
               "IDX file of images (magic 0x00000803: count x rows x cols bytes), plain or .gz."),
    sdk::param("labels", TSR_PARAM_STRING, nullptr,
               "IDX file of labels (magic 0x00000801: count bytes), plain or .gz; as many as "
               "images."),
    sdk::param("normalize", TSR_PARAM_BOOL, "true",
               "Scale pixels from 0..255 to [0, 1] (divide by 255) before mean and std."),
    sdk::param("mean", TSR_PARAM_FLOAT, "0.0",
               "Subtracted from every (scaled) pixel: input = (pixel - mean) / std."),
    sdk::param_min("std", TSR_PARAM_FLOAT, "1.0",
                   "Divides every (scaled, mean-subtracted) pixel; must be > 0.", 0.0),
    sdk::param_min("limit", TSR_PARAM_INT, "0", "Use only the first N samples; 0 uses all.", 0),
};

const tsr_plugin_descriptor kDescriptor =
    sdk::describe(TSR_KIND_DATASET, "idx", "1.0.0", kSummary, params, TSR_DEVICE_CPU, &kVtable);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kDescriptor)
