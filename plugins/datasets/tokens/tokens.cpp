// Dataset "tokens": token shards in llm.c's format (token_file.hpp,
// docs/data.md), uint16 or uint32 tokens, read with pread (token_file.hpp).
//
// `files` names the shards: glob patterns (one string or an array), whose
// matches are taken together, sorted by path and deduplicated. A shard of
// count tokens holds floor((count - 1) / context) windows of context + 1
// tokens, back to back without overlap; sample k is window k counting
// through the shards in order. A window gives input = tokens[i, i + T) and
// target = tokens[i + 1, i + T + 1), both int32 [T]; in a masked shard
// (docs/data.md: chat and instruction data) a target whose mask byte is 0
// is -100, which the loss ignores. The sampler's shuffle
// is what makes the windows random. With `vocab` > 0 every token of a
// window is checked to be below it as the window is read. `limit` keeps N
// windows spread evenly over all of them. With `pack` the windows are
// packed examples instead (packing.hpp): whole examples of masked shards
// that record their starts, with int32 positions restarting at 0 in each
// (ABI 1.8 tsr_batch.positions), the windows' tails padding.
#include <glob.h>
#include <tessera/dataset.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/dataset.hpp>
#include <tessera/cpp/extension.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

#include "packing.hpp"
#include "token_file.hpp"

namespace sdk = tessera::sdk;
using tessera::tokens::Shard;

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "Token shards in llm.c's format (1024-byte header; magic 20240520 version 1: uint16 "
    "tokens; magic 20240801 version 7: uint32 tokens; versions 1001/1007 with a loss mask), "
    "read with pread: non-overlapping windows of context + 1 tokens, int32 input [T] and "
    "next-token target [T] (-100 where the mask says the token is not trained); with pack = "
    "true, whole examples packed into the windows with restarting positions.";

// A target the loss ignores (ops.h: targets < 0), as Hugging Face writes it.
constexpr int32_t kIgnoredTarget = -100;

struct Dataset {
  static constexpr const char *kName = "tokens";  // for messages
  const tsr_host *host = nullptr;
  std::string section;  // "[data.train]", for messages
  int64_t context = 0;  // T
  int64_t vocab = 0;    // 0: unknown, no check
  int64_t length = 0;   // samples: every window, or `limit` of them spread evenly
  std::vector<std::unique_ptr<Shard>> shards;
  std::vector<int64_t> first_window;  // per shard, plus the total at the end
  bool pack = false;
  tessera::tokens::Packing packing;  // pack: the windows' pieces

  void info(tsr_data_info *out) const;
  void read(const int64_t *indices, tsr_batch *out) const;
};

// The sorted, deduplicated files the patterns match; a pattern matching
// nothing is an error naming it.
std::vector<std::string> expand(const std::vector<std::string> &patterns,
                                const std::string &section) {
  std::vector<std::string> out;
  for (const auto &pattern : patterns) {
    if (pattern.empty())
      throw sdk::Error(TSR_ERR_CONFIG, "tokens: " + section + " files: an empty pattern");
    glob_t g;
    std::memset(&g, 0, sizeof g);
    const int rc = ::glob(pattern.c_str(), GLOB_TILDE, nullptr, &g);
    if (rc == GLOB_NOMATCH) {
      ::globfree(&g);
      const bool wild = pattern.find_first_of("*?[") != std::string::npos;
      throw sdk::Error(TSR_ERR_CONFIG, "tokens: " + section + " files: " +
                                           (wild ? "pattern '" + pattern + "' matches no file"
                                                 : "no such file '" + pattern + "'"));
    }
    if (rc != 0) {
      ::globfree(&g);
      throw sdk::Error(TSR_ERR_IO, "tokens: " + section + " files: cannot expand pattern '" +
                                       pattern + "'" +
                                       (rc == GLOB_NOSPACE ? ": out of memory" : ": read error"));
    }
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void log_packing(const Dataset &ds) {
  const tessera::tokens::Packing &p = ds.packing;
  const double fill = p.windows() ? 100.0 * static_cast<double>(p.pairs) /
                                        static_cast<double>(p.windows() * ds.context)
                                  : 0.0;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.1f%%", fill);
  std::string msg = "tokens: " + ds.section + " pack: " + std::to_string(p.examples) +
                    " examples in " + std::to_string(p.windows()) + " windows of " +
                    std::to_string(ds.context) + " tokens, " + pct + " filled";
  if (p.split > 0)
    msg += ", " + std::to_string(p.split) + " longer than the context split into pieces";
  if (p.dropped > 0)
    msg += ", " + std::to_string(p.dropped) + " of a single token left out (nothing to predict)";
  ds.host->log(ds.host->ctx, TSR_LOG_INFO, msg.c_str());
}

std::unique_ptr<Dataset> build(const tsr_host *host, const tsr_config *cfg, const char *split) {
  sdk::Config c(host, cfg);
  auto ds = std::make_unique<Dataset>();
  ds->host = host;
  ds->section = std::string("[data.") + (split ? split : "?") + "]";
  const std::vector<std::string> patterns = c.get_string_array("files");
  ds->context = c.get_int("context");
  ds->vocab = c.get_int("vocab");
  const int64_t limit = c.get_int("limit");
  ds->pack = c.get_bool("pack");
  if (limit < 0)
    throw sdk::Error(TSR_ERR_CONFIG, "tokens: " + ds->section + " limit must be >= 0, got " +
                                         std::to_string(limit));
  if (patterns.empty())
    throw sdk::Error(TSR_ERR_CONFIG, "tokens: " + ds->section + " files is empty");
  if (ds->context < 1)
    throw sdk::Error(TSR_ERR_CONFIG, "tokens: " + ds->section + " context must be >= 1, got " +
                                         std::to_string(ds->context));
  if (ds->vocab < 0 || ds->vocab > (int64_t{1} << 31))
    throw sdk::Error(
        TSR_ERR_CONFIG,
        "tokens: " + ds->section + " vocab must be in [0, 2^31], got " + std::to_string(ds->vocab));

  int64_t tokens = 0, windows = 0;
  int widths = 0;  // bit 2 and/or 4
  for (const auto &path : expand(patterns, ds->section)) {
    auto shard = std::make_unique<Shard>(
        path, host->run ? "rank " + std::to_string(host->run->rank) : std::string());
    ds->first_window.push_back(windows);
    const int64_t n = shard->count();
    if (n > ds->context) windows += (n - 1) / ds->context;
    tokens += n;
    widths |= shard->width();
    ds->shards.push_back(std::move(shard));
  }
  ds->first_window.push_back(windows);
  if (ds->pack) {
    ds->packing = tessera::tokens::plan_packing(ds->shards, ds->context, ds->section);
    windows = ds->packing.windows();
  }
  ds->length = limit > 0 && limit < windows ? limit : windows;
  if (windows == 0)
    throw sdk::Error(
        TSR_ERR_INVALID,
        "tokens: " + ds->section + " the " + std::to_string(ds->shards.size()) +
            " shard(s) matching files (" + std::to_string(tokens) +
            " tokens) hold no window of context + 1 = " + std::to_string(ds->context + 1) +
            " tokens (first: '" + ds->shards.front()->path() + "')");

  if (host->log) {
    const std::string kind = widths == 2 ? "uint16" : widths == 4 ? "uint32" : "uint16/uint32";
    const std::string msg = "tokens: " + ds->section + " " + std::to_string(ds->length) +
                            (ds->length < windows ? " of " + std::to_string(windows) : "") +
                            " windows of " + std::to_string(ds->context) + "+1 tokens from " +
                            std::to_string(ds->shards.size()) + " shard(s), " +
                            std::to_string(tokens) + " " + kind + " tokens, first '" +
                            ds->shards.front()->path() + "'";
    host->log(host->ctx, TSR_LOG_INFO, msg.c_str());
    if (ds->pack) log_packing(*ds);
  }
  return ds;
}

// int32 [T] windows, inputs and next-token targets; vocab as num_classes;
// positions with packing.
tsr_data_info window_info(int64_t length, int64_t context, int64_t vocab, bool pack) {
  auto d = sdk::make<tsr_data_info>();
  d.positions = pack ? 1 : 0;
  d.length = length;
  d.input_dtype = sdk::dtype_i32();
  d.input_ndim = 1;
  d.input_shape[0] = context;
  d.target_dtype = sdk::dtype_i32();
  d.target_ndim = 1;
  d.target_shape[0] = context;
  d.num_classes = vocab;
  return d;
}

void Dataset::info(tsr_data_info *out) const {
  if (!TSR_HAS_FIELD(out, tsr_data_info, num_classes))
    throw sdk::Error(TSR_ERR_INVALID, "tokens: info: output struct missing or too small");
  sdk::copy_out(window_info(length, context, vocab, pack), out);
}

// TSR_EXT_DATASET_SHAPE: the windows' shape from the config alone (no shard
// opened), for generation from a checkpoint without its training data.
tsr_status shape(const tsr_host *host, const tsr_config *cfg, tsr_data_info *out) {
  return sdk::guard(host, [&] {
    if (!TSR_HAS_FIELD(out, tsr_data_info, num_classes))
      throw sdk::Error(TSR_ERR_INVALID, "tokens: shape: output struct missing or too small");
    sdk::Config c(host, cfg);
    const int64_t context = c.get_int("context");
    if (context < 1)
      throw sdk::Error(TSR_ERR_CONFIG,
                       "tokens: context must be >= 1, got " + std::to_string(context));
    sdk::copy_out(window_info(0, context, c.get_int("vocab"), c.get_bool("pack")), out);
  });
}

const tsr_ext_dataset_shape shape_extension = {tsr_ext_dataset_shape_STRUCT_SIZE, shape};
const sdk::Extension extensions[] = {{TSR_EXT_DATASET_SHAPE, &shape_extension}};

const void *get_extension(const char *id) {
  return sdk::find_extension(extensions, id);
}

bool host_memory(const DLTensor &t) {
  return t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost;
}

void check_tensor(const Dataset &ds, const DLTensor &t, const char *what, int64_t n) {
  const std::string where = "tokens: " + ds.section + " read: batch " + what;
  if (!host_memory(t)) throw sdk::Error(TSR_ERR_INVALID, where + " is not in host memory");
  const DLDataType i32 = sdk::dtype_i32();
  if (t.dtype.code != i32.code || t.dtype.bits != i32.bits || t.dtype.lanes != i32.lanes)
    throw sdk::Error(TSR_ERR_INVALID, where + " has the wrong dtype (want int32)");
  if (t.ndim != 2 || !t.shape || t.shape[0] != n || t.shape[1] != ds.context)
    throw sdk::Error(TSR_ERR_INVALID, where + " has the wrong shape (want [" + std::to_string(n) +
                                          ", " + std::to_string(ds.context) + "])");
  if (t.strides &&
      !((n == 1 || t.strides[0] == ds.context) && (ds.context == 1 || t.strides[1] == 1)))
    throw sdk::Error(TSR_ERR_INVALID, where + " is not contiguous");
  if (!t.data) throw sdk::Error(TSR_ERR_INVALID, where + " has no data");
}

void Dataset::read(const int64_t *indices, tsr_batch *out) const {
  if (!TSR_HAS_FIELD(out, tsr_batch, targets))
    throw sdk::Error(TSR_ERR_INVALID, "tokens: read: batch struct missing or too small");
  const int64_t n = out->size;
  if (n < 0)
    throw sdk::Error(TSR_ERR_INVALID,
                     "tokens: " + section + " read: negative batch size " + std::to_string(n));
  if (n == 0) return;
  if (!indices) throw sdk::Error(TSR_ERR_INVALID, "tokens: " + section + " read: no indices");
  check_tensor(*this, out->inputs, "inputs", n);
  check_tensor(*this, out->targets, "targets", n);
  if (pack) {
    if (!TSR_HAS_FIELD(out, tsr_batch, positions) || !out->positions.data)
      throw sdk::Error(TSR_ERR_UNSUPPORTED,
                       "tokens: " + section +
                           " pack = true needs a batch with positions (ABI 1.8); this host "
                           "gave none");
    check_tensor(*this, out->positions, "positions", n);
  }
  const int64_t windows = pack ? packing.windows() : first_window.back();
  const int64_t T = context;
  // vocab 0: only ids that fit int32 (uint32 shards could hold more).
  const uint64_t limit = vocab > 0 ? uint64_t(vocab) : uint64_t{1} << 31;
  auto *x =
      reinterpret_cast<int32_t *>(static_cast<char *>(out->inputs.data) + out->inputs.byte_offset);
  auto *y = reinterpret_cast<int32_t *>(static_cast<char *>(out->targets.data) +
                                        out->targets.byte_offset);
  std::vector<int32_t> window(static_cast<size_t>(T + 1));
  std::vector<uint8_t> mask(static_cast<size_t>(T + 1));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t sample = indices[i];
    if (sample < 0 || sample >= length)
      throw sdk::Error(TSR_ERR_INVALID, "tokens: " + section + " read: sample index " +
                                            std::to_string(sample) + " (batch position " +
                                            std::to_string(i) + ") is out of range [0, " +
                                            std::to_string(length) + ")");
    // With a limit, sample j is window floor(j * windows / length).
    const int64_t k = length == windows
                          ? sample
                          : static_cast<int64_t>(static_cast<unsigned __int128>(sample) *
                                                 static_cast<unsigned __int128>(windows) /
                                                 static_cast<unsigned __int128>(length));
    if (pack) {
      auto *pos = reinterpret_cast<int32_t *>(static_cast<char *>(out->positions.data) +
                                              out->positions.byte_offset);
      tessera::tokens::read_packed(packing, shards, k, T, limit, vocab, section, x + i * T,
                                   y + i * T, pos + i * T);
      continue;
    }
    const auto it = std::upper_bound(first_window.begin(), first_window.end(), k);
    const size_t s = static_cast<size_t>(it - first_window.begin()) - 1;
    const Shard &shard = *shards[s];
    const int64_t start = (k - first_window[s]) * T;
    shard.copy(start, T + 1, window.data());
    shard.check_ids(window.data(), start, T + 1, limit, vocab, section);
    std::memcpy(x + i * T, window.data(), static_cast<size_t>(T) * sizeof(int32_t));
    std::memcpy(y + i * T, window.data() + 1, static_cast<size_t>(T) * sizeof(int32_t));
    if (shard.masked()) {
      shard.copy_mask(start, T + 1, mask.data());
      for (int64_t j = 0; j < T; ++j)
        if (mask[static_cast<size_t>(j + 1)] == 0) y[i * T + j] = kIgnoredTarget;
    }
  }
}

const tsr_dataset_vtable kVtable = sdk::dataset_vtable<Dataset, build>();

const tsr_param_decl params[] = {
    sdk::param("files", TSR_PARAM_STRING_ARRAY, nullptr,
               "Token shards: a glob pattern or an array of them (relative to the working "
               "directory), e.g. 'data/fortunes/fortunes_train_*.bin'; all matches, sorted by "
               "path."),
    sdk::param_min("context", TSR_PARAM_INT, nullptr,
                   "Tokens per sample (T): a sample is a window of T + 1 tokens, input its "
                   "first T, target its last T.",
                   1),
    sdk::param_min("vocab", TSR_PARAM_INT, "0",
                   "Vocabulary size: every token read must be below it (checked per window as "
                   "it is read) and it is reported as num_classes; 0: no check.",
                   0),
    sdk::param("pack", TSR_PARAM_BOOL, "false",
               "Pack whole examples into the windows (chat and instruction shards that record "
               "their example starts, written by `tessera data tokenize --format ...`): "
               "positions restart at 0 in each example and attention stays inside it; an "
               "example longer than the context is split into pieces; window tails are padding "
               "(target -100). docs/data.md, Packing."),
    sdk::param_min("limit", TSR_PARAM_INT, "0",
                   "Use only N windows, spread evenly over the shards (sample j is window "
                   "floor(j * windows / N)), e.g. for a quicker eval; 0 uses all.",
                   0),
};

const tsr_plugin_descriptor kDescriptor = sdk::describe(
    TSR_KIND_DATASET, "tokens", "1.0.0", kSummary, params, TSR_DEVICE_CPU, &kVtable, get_extension);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kDescriptor)
