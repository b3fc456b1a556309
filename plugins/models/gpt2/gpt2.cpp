// The gpt2 model plugin: GPT-2 as Hugging Face's GPT2LMHeadModel computes it,
// with its parameter names and layouts, so a Hugging Face checkpoint loads
// and exports as a plain copy by name.
//
//   x_0     = wte[ids] + wpe[0..T)                           (embeddings)
//   block l:  r   = x_l + c_proj(attn(c_attn(ln_1(x_l))))     (pre-LayerNorm)
//             x_{l+1} = r + mlp.c_proj(gelu_tanh(c_fc(ln_2(r))))
//   logits  = ln_f(x_L) @ wte^T                                (LM head tied to wte)
//   loss    = softmax cross-entropy of logits[b, t] against targets[b, t]
//
// The dataset gives token windows: inputs int32 [T] and targets int32 [T]
// per sample (targets < 0 are ignored); the model does not shift them, the
// dataset does. Any T up to `context` is accepted at run time.
//
// predict (ABI 1.1, for generation) runs the same forward on inputs alone
// and returns float32 logits [B, vocab] of each sequence's last position
// only: ln_f and the LM head run on those B rows, over the real vocabulary.
//
// Parameters (Hugging Face names, their Conv1D layout [in, out] kept as is,
// so the forward is x[rows, in] @ W[in, out] with no transpose):
//   group 0:      transformer.wte.weight [padded_vocab, C]   (see below)
//                 transformer.wpe.weight [context, C]
//   group 1 + l:  transformer.h.<l>.ln_1.{weight,bias} [C]
//                 transformer.h.<l>.attn.c_attn.weight [C, 3C], .bias [3C]
//                 transformer.h.<l>.attn.c_proj.weight [C, C], .bias [C]
//                 transformer.h.<l>.ln_2.{weight,bias} [C]
//                 transformer.h.<l>.mlp.c_fc.weight [C, 4C], .bias [4C]
//                 transformer.h.<l>.mlp.c_proj.weight [4C, C], .bias [C]
//   group L + 1:  transformer.ln_f.{weight,bias} [C]
// There is no lm_head.weight: the head is wte (Hugging Face ties them too).
//
// Vocabulary padding: wte has padded_vocab = round_up(vocab, vocab_pad_to)
// rows (GPT-2's 50257 -> 50304) so the LM head's matmul has a friendly
// shape. Rows at or past `vocab` are padding: cross_entropy's valid_classes
// keeps them out of the softmax and gives them zero gradient, and no token id
// reaches them: they never get a gradient (weight decay may shrink them) and
// never change a result. "transformer.wte.weight" is the one parameter whose
// declared shape differs from Hugging Face's [vocab, C]: an export for
// Hugging Face keeps its first `vocab` rows (`tessera ckpt export` trims
// them: engine/ckpt/export_hf.cpp), and init_from's loader fills
// the first rows of a [vocab, C] tensor and leaves the padding rows at their
// initialiser (engine/train/init_from.cpp).
//
// The tied wte and ZeRO stage 3: wte is used first (embedding) and last (LM
// head) in forward, and its gradient gets contributions first (head) and
// last (embedding backward) in backward. So group 0 stays live through the
// whole forward: its view, taken once before the embedding, is reused for
// the head and params_done(0) comes after the head (asking for the group
// again at the end would make stage 3 gather it again, and prefetch block 0
// for nothing). In backward the groups finish in the order L+1, L, ..., 1, 0:
// group 0's gradient is final only after the embedding backward, the very
// last thing.
//
// Activations live in memory allocated once at create for max_micro_batch
// sequences of `context` tokens, in the compute dtype (the parameter views'
// dtype: float32 on the CPU, bfloat16/float16 in mixed-precision CUDA runs);
// LayerNorm statistics and attention log-sum-exps are float32, token ids
// int32. With recompute = true only each block's input (the residual stream)
// is kept, and backward recomputes one block's activations at a time into a
// single shared set, before its backward: the same ops on the same inputs,
// so the gradients are bitwise those of recompute = false.
#include <tessera/tessera.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace {

namespace sdk = tessera::sdk;
using sdk::Buffer;
using sdk::check;
using sdk::Error;

constexpr float kLayerNormEps = 1e-5f;  // GPT-2's layer_norm_epsilon

// Per-block parameter indices, relative to the block's first.
enum BlockParam : uint32_t {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kMlpProjW,
  kMlpProjB,
  kBlockParams
};
const char *const kBlockNames[kBlockParams] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
constexpr uint32_t kWte = 0, kWpe = 1, kFirstBlock = 2;

std::string dtype_str(DLDataType t) {
  const char *base = t.code == kDLFloat    ? "float"
                     : t.code == kDLInt    ? "int"
                     : t.code == kDLUInt   ? "uint"
                     : t.code == kDLBfloat ? "bfloat"
                                           : "dtype?_";
  std::string s = base + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

bool is_i32(DLDataType t) {
  return same_dtype(t, sdk::dtype_i32());
}

std::string shape_str(const int64_t *shape, int32_t ndim) {
  std::string s = "[";
  for (int32_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The compute dtype of a run's precision (the CPU computes in float32).
DLDataType compute_dtype(const tsr_run_info &run) {
  if (run.device.device_type == kDLCPU || run.device.device_type == kDLCUDAHost)
    return sdk::dtype_f32();
  if (run.precision == TSR_PRECISION_BF16) return DLDataType{kDLBfloat, 16, 1};
  if (run.precision == TSR_PRECISION_FP16) return DLDataType{kDLFloat, 16, 1};
  return sdk::dtype_f32();
}

// A view with up to 5 dims and optional strides that owns its shape; get()
// re-points the DLTensor at this object's arrays, so views copy freely.
class View {
 public:
  View() { std::memset(&t_, 0, sizeof t_); }
  View(void *data, size_t byte_offset, DLDevice device, DLDataType dtype,
       std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides = {}) {
    std::memset(&t_, 0, sizeof t_);
    t_.data = data;
    t_.byte_offset = byte_offset;
    t_.device = device;
    t_.dtype = dtype;
    t_.ndim = static_cast<int32_t>(shape.size());
    std::copy(shape.begin(), shape.end(), shape_);
    strided_ = strides.size() != 0;
    std::copy(strides.begin(), strides.end(), strides_);
  }
  // The memory of `base` (a compact tensor) with another shape.
  View(const DLTensor &base, std::initializer_list<int64_t> shape)
      : View(base.data, base.byte_offset, base.device, base.dtype, shape) {}
  DLTensor *get() {
    t_.shape = shape_;
    t_.strides = strided_ ? strides_ : nullptr;
    return &t_;
  }

 private:
  DLTensor t_;
  int64_t shape_[5] = {0, 0, 0, 0, 0};
  int64_t strides_[5] = {0, 0, 0, 0, 0};
  bool strided_ = false;
};

// '*' matches any run of characters (dots included), '?' any one.
bool glob_match(const char *pat, const char *s) {
  const char *star = nullptr, *resume = nullptr;
  while (*s) {
    if (*pat == '*') {
      star = pat++;
      resume = s;
    } else if (*pat == '?' || *pat == *s) {
      ++pat;
      ++s;
    } else if (star) {
      pat = star + 1;
      s = ++resume;
    } else {
      return false;
    }
  }
  while (*pat == '*') ++pat;
  return *pat == '\0';
}

std::string read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(TSR_ERR_IO, "gpt2: cannot open " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool is_dir(const std::string &path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

// Model dimensions.
struct Dims {
  int64_t layers = 0, heads = 0, width = 0, context = 0, vocab = 0, padded_vocab = 0;
};

// A Hugging Face GPT-2 checkpoint directory (config.json + model.safetensors).
struct HfCheckpoint {
  std::string dir, config_path, weights_path;
  Dims dims;
  nlohmann::json header;  // the safetensors header
};

int64_t json_int(const nlohmann::json &j, const char *key, const std::string &file) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer())
    throw Error(TSR_ERR_INVALID, "gpt2: " + file + " has no integer '" + key + "'");
  return it->get<int64_t>();
}

HfCheckpoint open_checkpoint(const std::string &from) {
  HfCheckpoint ck;
  if (is_dir(from)) {
    ck.dir = from;
    ck.weights_path = from + "/model.safetensors";
  } else {
    const size_t slash = from.find_last_of('/');
    ck.dir = slash == std::string::npos ? "." : from.substr(0, slash);
    ck.weights_path = from;
  }
  ck.config_path = ck.dir + "/config.json";
  std::ifstream probe(ck.weights_path, std::ios::binary);
  if (!probe)
    throw Error(TSR_ERR_IO, "gpt2: init_from '" + from + "': cannot open " + ck.weights_path +
                                " (init_from is a Hugging Face model directory with "
                                "config.json and model.safetensors)");

  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(read_file(ck.config_path));
  } catch (const nlohmann::json::exception &e) {
    throw Error(TSR_ERR_INVALID, "gpt2: " + ck.config_path + ": " + e.what());
  }
  const std::string &cp = ck.config_path;
  if (cfg.contains("model_type") && cfg["model_type"] != "gpt2")
    throw Error(TSR_ERR_UNSUPPORTED, "gpt2: " + cp + " describes a '" +
                                         cfg["model_type"].get<std::string>() +
                                         "' model, not gpt2");
  ck.dims.layers = json_int(cfg, "n_layer", cp);
  ck.dims.heads = json_int(cfg, "n_head", cp);
  ck.dims.width = json_int(cfg, "n_embd", cp);
  ck.dims.context =
      cfg.contains("n_positions") ? json_int(cfg, "n_positions", cp) : json_int(cfg, "n_ctx", cp);
  ck.dims.vocab = json_int(cfg, "vocab_size", cp);
  // What this plugin computes: refuse a config.json that asks for otherwise.
  if (cfg.contains("n_inner") && !cfg["n_inner"].is_null() &&
      cfg["n_inner"].get<int64_t>() != 4 * ck.dims.width)
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: " + cp + ": n_inner " + cfg["n_inner"].dump() +
                    " is not 4 * n_embd; the gpt2 plugin's MLP is 4 * width wide");
  if (cfg.contains("activation_function")) {
    const std::string act = cfg["activation_function"].get<std::string>();
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
      throw Error(TSR_ERR_UNSUPPORTED, "gpt2: " + cp + ": activation_function '" + act +
                                           "'; the gpt2 plugin computes the tanh GELU "
                                           "(gelu_new)");
  }
  if (cfg.contains("layer_norm_epsilon") &&
      std::fabs(cfg["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12)
    throw Error(TSR_ERR_UNSUPPORTED, "gpt2: " + cp + ": layer_norm_epsilon " +
                                         cfg["layer_norm_epsilon"].dump() +
                                         "; the gpt2 plugin uses 1e-5");
  if (cfg.value("scale_attn_by_inverse_layer_idx", false))
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: " + cp + ": scale_attn_by_inverse_layer_idx is not supported");
  if (cfg.contains("scale_attn_weights") && !cfg.value("scale_attn_weights", true))
    throw Error(TSR_ERR_UNSUPPORTED, "gpt2: " + cp + ": scale_attn_weights = false");
  if (!cfg.value("tie_word_embeddings", true))
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: " + cp + ": tie_word_embeddings = false (the LM head is wte here)");

  // The safetensors header: 8-byte little-endian length, then JSON.
  unsigned char len8[8] = {0};
  probe.read(reinterpret_cast<char *>(len8), 8);
  if (!probe) throw Error(TSR_ERR_INVALID, "gpt2: " + ck.weights_path + " is too short");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];
  if (n > (uint64_t{100} << 20))
    throw Error(TSR_ERR_INVALID, "gpt2: " + ck.weights_path + ": implausible header length " +
                                     std::to_string(n) + " (not a safetensors file?)");
  std::string text(static_cast<size_t>(n), '\0');
  probe.read(text.data(), static_cast<std::streamsize>(n));
  if (!probe)
    throw Error(TSR_ERR_INVALID, "gpt2: " + ck.weights_path + ": truncated safetensors header");
  try {
    ck.header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception &e) {
    throw Error(TSR_ERR_INVALID, "gpt2: " + ck.weights_path + ": " + e.what());
  }
  return ck;
}

// Fills a dimension from config.json: an explicit (non-zero) config key must
// agree with it; zero takes it.
void merge_dim(int64_t &dim, int64_t from_file, const char *key, const char *hf_key,
               const std::string &file) {
  if (dim != 0 && dim != from_file)
    throw Error(TSR_ERR_CONFIG, std::string("gpt2: model.") + key + " = " + std::to_string(dim) +
                                    " but " + file + " has " + hf_key + " = " +
                                    std::to_string(from_file) +
                                    " (leave the key out to take the checkpoint's)");
  dim = from_file;
}

struct Gpt2 {
  const tsr_host *host = nullptr;
  const tsr_ops *ops = nullptr;
  DLDevice device{kDLCPU, 0};
  Dims d;
  int64_t max_batch = 0, data_T = 0;
  bool recompute = false;
  std::deque<std::string> names;  // parameter names; infos point into them
  std::vector<tsr_param_info> infos;
  // Backward runs stage s (0 embeddings, 1..L blocks, L+1 ln_f) only when
  // some parameter at a stage <= s is trainable: below the lowest trainable
  // stage no gradient is needed. L+2 when nothing is trainable.
  int64_t lowest_trainable_stage = 0;

  // Activation memory, in elements of the compute dtype (act) or float32
  // (stats), carved out of two allocations.
  DLDataType adt = sdk::dtype_f32();
  size_t esize = 4;
  Buffer act, stats;
  Buffer predict_f32;  // predict's float32 logits on the device (16-bit runs only)
  struct Set {         // one block's activations
    size_t ln1, qkv, atty, r2, ln2, fch, fchg;  // in act
    size_t m1, s1, m2, s2, lse;                 // in stats
  };
  std::vector<size_t> resid;  // x_0 .. x_L in act
  std::vector<Set> sets;      // L sets, or 1 with recompute
  size_t lnf = 0, logits = 0, dres = 0, dsmall = 0, dbig = 0, discard = 0;  // in act
  size_t lnf_m = 0, lnf_s = 0;                                              // in stats
  size_t act_elems = 0, stats_elems = 0;

  // What backward may rely on: a training forward of n sequences of T.
  bool ready = false;
  int64_t ready_n = 0, ready_T = 0;

  uint32_t L() const { return static_cast<uint32_t>(d.layers); }
  int64_t C() const { return d.width; }
  uint32_t block_param(uint32_t l, BlockParam p) const {
    return kFirstBlock + kBlockParams * l + p;
  }
  uint32_t lnf_w() const { return kFirstBlock + kBlockParams * L(); }
  uint32_t lnf_b() const { return lnf_w() + 1; }
  bool trainable(uint32_t i) const { return infos[i].trainable != 0; }

  // ---- memory --------------------------------------------------------------

  void plan_memory() {
    const size_t R = static_cast<size_t>(max_batch * d.context);
    const size_t C = static_cast<size_t>(d.width), H = static_cast<size_t>(d.heads);
    auto take = [](size_t &cursor, size_t n) {
      const size_t at = cursor;
      cursor += (n + 63) / 64 * 64;  // 256-byte aligned in float32
      return at;
    };
    size_t a = 0, s = 0;
    resid.clear();
    for (uint32_t l = 0; l <= L(); ++l) resid.push_back(take(a, R * C));
    sets.assign(recompute ? 1 : L(), Set{});
    for (Set &x : sets) {
      x.ln1 = take(a, R * C);
      x.qkv = take(a, 3 * R * C);
      x.atty = take(a, R * C);
      x.r2 = take(a, R * C);
      x.ln2 = take(a, R * C);
      x.fch = take(a, 4 * R * C);
      x.fchg = take(a, 4 * R * C);
      x.m1 = take(s, R);
      x.s1 = take(s, R);
      x.m2 = take(s, R);
      x.s2 = take(s, R);
      x.lse = take(s, H * R);
    }
    lnf = take(a, R * C);
    logits = take(a, R * static_cast<size_t>(d.padded_vocab));
    dres = take(a, R * C);
    dsmall = take(a, R * C);
    dbig = take(a, 4 * R * C);
    discard = take(a, 2 * C);
    lnf_m = take(s, R);
    lnf_s = take(s, R);
    act_elems = a;
    stats_elems = s;
  }

  void allocate(DLDataType dtype) {
    act.reset();
    stats.reset();
    adt = dtype;
    esize = static_cast<size_t>(dtype.bits / 8);
    act = Buffer(host, device, act_elems * esize, TSR_MEM_ACTIVATIONS);
    stats = Buffer(host, device, stats_elems * 4, TSR_MEM_ACTIVATIONS);
  }

  // Parameters come in the compute dtype the host chose; activations follow.
  void ensure_dtype(const DLTensor &p) {
    if (same_dtype(p.dtype, adt)) return;
    if (p.dtype.lanes != 1 || !(p.dtype.code == kDLFloat || p.dtype.code == kDLBfloat) ||
        !(p.dtype.bits == 32 || p.dtype.bits == 16))
      throw Error(TSR_ERR_UNSUPPORTED,
                  "gpt2: parameters are " + dtype_str(p.dtype) +
                      "; the gpt2 model computes in float32, bfloat16 or float16");
    const std::string msg = "gpt2: the parameters are " + dtype_str(p.dtype) +
                            ", not the expected " + dtype_str(adt) +
                            "; reallocating the activations";
    host->log(host->ctx, TSR_LOG_WARN, msg.c_str());
    allocate(p.dtype);
  }

  // Activations in the compute dtype, float32 statistics.
  View A(size_t off, std::initializer_list<int64_t> shape) const {
    return View(act.get(), off * esize, device, adt, shape);
  }
  View S(size_t off, std::initializer_list<int64_t> shape) const {
    return View(stats.get(), off * 4, device, sdk::dtype_f32(), shape);
  }
  // q, k or v (which = 0, 1, 2) of a fused [B, T, 3, H, D] buffer at `off`.
  View qkv_part(size_t off, int64_t B, int64_t T, int which) const {
    const int64_t C = d.width, H = d.heads, D = C / H;
    return View(act.get(), (off + static_cast<size_t>(which * C)) * esize, device, adt,
                {B, T, H, D}, {T * 3 * C, 3 * C, D, 1});
  }

  // ---- parameters ----------------------------------------------------------

  DLTensor view_of(tsr_step *step, uint32_t index, bool grad) const {
    DLTensor t;
    std::memset(&t, 0, sizeof t);
    check(grad ? host->grad(step, index, &t) : host->param(step, index, &t));
    const tsr_param_info &p = infos[index];
    int64_t want = 1, got = 1;
    for (int32_t k = 0; k < p.ndim; ++k) want *= p.shape[k];
    for (int32_t k = 0; k < t.ndim; ++k) got *= t.shape ? t.shape[k] : -1;
    if (got != want)
      throw Error(TSR_ERR_INTERNAL, std::string("gpt2: the host's ") +
                                        (grad ? "gradient" : "parameter") + " view of '" + p.name +
                                        "' has " + std::to_string(got) + " elements, expected " +
                                        std::to_string(want));
    if (t.strides) {  // compact only: reshaped views below assume it
      int64_t expect = 1;
      for (int32_t k = t.ndim - 1; k >= 0; --k) {
        if (t.shape[k] != 1 && t.strides[k] != expect)
          throw Error(TSR_ERR_INTERNAL,
                      std::string("gpt2: the host's view of '") + p.name + "' is not compact");
        expect *= t.shape[k];
      }
    }
    return t;
  }
  DLTensor param(tsr_step *step, uint32_t index) const { return view_of(step, index, false); }
  DLTensor grad(tsr_step *step, uint32_t index) const { return view_of(step, index, true); }
  // The gradient of a trainable parameter, or a zeroed scratch of its size
  // for a frozen one (layernorm_backward always writes dweight and dbias).
  View grad_or_discard(tsr_step *step, uint32_t index, int which) {
    if (trainable(index)) return View(grad(step, index), {d.width});
    View v = A(discard + static_cast<size_t>(which * d.width), {d.width});
    check(ops->fill(host->ctx, v.get(), 0.0f));
    return v;
  }

  void params_done(tsr_step *step, uint32_t group) const {
    if (TSR_HAS_FIELD(host, tsr_host, params_done) && host->params_done)
      check(host->params_done(step, group));
  }

  // ---- batch ---------------------------------------------------------------

  // Checks the batch and returns its sequence length. predict passes
  // with_targets = false: its targets may be absent and are not read.
  int64_t check_batch(const tsr_batch *batch, bool with_targets = true) const {
    if (!batch) throw Error(TSR_ERR_INVALID, "gpt2: batch is NULL");
    const int64_t n = batch->size;
    if (n < 0 || n > max_batch)
      throw Error(TSR_ERR_INVALID, "gpt2: batch of " + std::to_string(n) +
                                       " sequences; the model was built for at most " +
                                       std::to_string(max_batch));
    if (n == 0) return 0;
    const DLTensor &x = batch->inputs, &y = batch->targets;
    for (const DLTensor *t : {&x, &y}) {
      if (t == &y && !with_targets) break;
      const char *what = t == &x ? "inputs" : "targets";
      if (!is_i32(t->dtype))
        throw Error(TSR_ERR_INVALID, std::string("gpt2: batch ") + what +
                                         " must be int32 token ids, got " + dtype_str(t->dtype));
      if (t->ndim != 2 || !t->shape || t->shape[0] != n)
        throw Error(TSR_ERR_INVALID, std::string("gpt2: batch ") + what + " are " +
                                         (t->shape ? shape_str(t->shape, t->ndim) : "?") +
                                         ", expected [" + std::to_string(n) + ", T]");
      if (t->device.device_type != device.device_type || t->device.device_id != device.device_id)
        throw Error(TSR_ERR_INVALID,
                    std::string("gpt2: batch ") + what + " are not on the model's device");
      if (t->strides && ((t->shape[1] != 1 && t->strides[1] != 1) ||
                         (t->shape[0] != 1 && t->strides[0] != t->shape[1])))
        throw Error(TSR_ERR_INVALID,
                    std::string("gpt2: batch ") + what + " must be contiguous row-major");
    }
    const int64_t T = x.shape[1];
    if (with_targets && y.shape[1] != T)
      throw Error(TSR_ERR_INVALID, "gpt2: batch targets have " + std::to_string(y.shape[1]) +
                                       " tokens per sequence, inputs " + std::to_string(T));
    if (T < 1 || T > d.context)
      throw Error(TSR_ERR_INVALID, "gpt2: sequences of " + std::to_string(T) +
                                       " tokens; the model's context is " +
                                       std::to_string(d.context));
    return T;
  }

  // ---- forward -------------------------------------------------------------

  // Block l from its input x_l (resid[l]) into set `s`; with `out` the block
  // output x_{l+1} goes to resid[l + 1] (a recompute in backward skips it).
  void block_forward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T, bool out) {
    const int64_t R = B * T, C = d.width, H = d.heads, D = C / H;
    tsr_host_ctx *ctx = host->ctx;
    const auto P = [&](BlockParam p) { return param(step, block_param(l, p)); };
    View x = A(resid[l], {R, C});
    View ln1 = A(s.ln1, {R, C}), qkv = A(s.qkv, {R, 3 * C}), atty = A(s.atty, {R, C});
    View r2 = A(s.r2, {R, C}), ln2 = A(s.ln2, {R, C});
    View fch = A(s.fch, {R, 4 * C}), fchg = A(s.fchg, {R, 4 * C});
    View m1 = S(s.m1, {R}), s1 = S(s.s1, {R}), m2 = S(s.m2, {R}), s2 = S(s.s2, {R});
    View lse = S(s.lse, {B, H, T});

    DLTensor w = P(kLn1W), b = P(kLn1B);
    check(
        ops->layernorm_forward(ctx, x.get(), &w, &b, kLayerNormEps, ln1.get(), m1.get(), s1.get()));
    w = P(kQkvW);
    b = P(kQkvB);
    check(ops->linear(ctx, ln1.get(), 0, &w, 0, &b, TSR_ACT_NONE, qkv.get(), nullptr));
    View q = qkv_part(s.qkv, B, T, 0), k = qkv_part(s.qkv, B, T, 1), v = qkv_part(s.qkv, B, T, 2);
    View o = A(s.atty, {B, T, H, D});
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    check(ops->attention_forward(ctx, q.get(), k.get(), v.get(), scale, o.get(), lse.get()));
    w = P(kAttnProjW);
    b = P(kAttnProjB);
    check(ops->linear(ctx, atty.get(), 0, &w, 0, &b, TSR_ACT_NONE, r2.get(), nullptr));
    check(ops->axpy(ctx, 1.0f, x.get(), r2.get()));  // r = x + attn
    w = P(kLn2W);
    b = P(kLn2B);
    check(ops->layernorm_forward(ctx, r2.get(), &w, &b, kLayerNormEps, ln2.get(), m2.get(),
                                 s2.get()));
    w = P(kFcW);
    b = P(kFcB);
    check(ops->linear(ctx, ln2.get(), 0, &w, 0, &b, TSR_ACT_GELU, fchg.get(), fch.get()));
    if (!out) return;
    View y = A(resid[l + 1], {R, C});
    w = P(kMlpProjW);
    b = P(kMlpProjB);
    check(ops->linear(ctx, fchg.get(), 0, &w, 0, &b, TSR_ACT_NONE, y.get(), nullptr));
    check(ops->axpy(ctx, 1.0f, r2.get(), y.get()));  // x_{l+1} = r + mlp
  }

  // Embeddings and blocks: x_L into resid[L] for B sequences of T tokens.
  // Returns wte's view, which serves the LM head too: group 0 stays live
  // (the caller says params_done(0) after the head).
  DLTensor trunk(tsr_step *step, const DLTensor &inputs, int64_t B, int64_t T) {
    const int64_t R = B * T, C = d.width;
    tsr_host_ctx *ctx = host->ctx;
    View ids(inputs, {R});
    DLTensor wte = param(step, kWte);
    ensure_dtype(wte);
    DLTensor wpe = param(step, kWpe);
    View x0 = A(resid[0], {R, C});
    check(ops->embedding_forward(ctx, ids.get(), &wte, x0.get(), 0));
    View pos(wpe, {T * C});  // wpe[0..T) as one run
    for (int64_t b = 0; b < B; ++b) {
      View xb = A(resid[0] + static_cast<size_t>(b * T * C), {T * C});
      check(ops->axpy(ctx, 1.0f, pos.get(), xb.get()));
    }
    for (uint32_t l = 0; l < L(); ++l) {
      block_forward(step, l, sets[recompute ? 0 : l], B, T, true);
      params_done(step, l + 1);
    }
    return wte;
  }

  void forward(tsr_step *step, const tsr_batch *batch, int32_t training, tsr_forward_result *out) {
    ready = false;
    if (!out) throw Error(TSR_ERR_INVALID, "gpt2: forward result is NULL");
    const int64_t T = check_batch(batch);
    const int64_t B = batch->size;
    double loss_sum = 0;
    int64_t count = 0, correct = 0;
    if (B > 0) {
      const int64_t R = B * T, C = d.width;
      tsr_host_ctx *ctx = host->ctx;
      View tgt(batch->targets, {R});
      DLTensor wte = trunk(step, batch->inputs, B, T);

      View xL = A(resid[L()], {R, C}), lnf_y = A(lnf, {R, C});
      View m = S(lnf_m, {R}), s = S(lnf_s, {R});
      DLTensor w = param(step, lnf_w()), b = param(step, lnf_b());
      check(ops->layernorm_forward(ctx, xL.get(), &w, &b, kLayerNormEps, lnf_y.get(), m.get(),
                                   s.get()));
      params_done(step, L() + 1);

      // LM head: logits = ln_f(x_L) @ wte^T over the padded vocabulary.
      View z = A(logits, {R, d.padded_vocab});
      check(ops->linear(ctx, lnf_y.get(), 0, &wte, 1, nullptr, TSR_ACT_NONE, z.get(), nullptr));
      params_done(step, 0);
      check(ops->cross_entropy(ctx, z.get(), tgt.get(), d.vocab, 1.0f, nullptr, &loss_sum, &count,
                               &correct));
    }
    out->loss_sum = loss_sum;
    out->count = count;
    out->correct = correct;
    ready = training != 0;
    ready_n = B;
    ready_T = T;
  }

  // ---- predict -------------------------------------------------------------

  // The caller's logits: float32 [B, vocab], compact, in host memory or on
  // the model's device.
  void check_logits(const DLTensor *out, int64_t B) const {
    if (!out) throw Error(TSR_ERR_INVALID, "gpt2: predict logits is NULL");
    std::string want = "[";  // built up in steps: GCC 12 misreads "[" + std::string
    want += std::to_string(B) + ", " + std::to_string(d.vocab) + "]";
    if (!same_dtype(out->dtype, sdk::dtype_f32()))
      throw Error(TSR_ERR_INVALID,
                  "gpt2: predict logits must be float32, got " + dtype_str(out->dtype));
    if (out->ndim != 2 || !out->shape || out->shape[0] != B || out->shape[1] != d.vocab)
      throw Error(TSR_ERR_INVALID, "gpt2: predict logits are " +
                                       (out->shape ? shape_str(out->shape, out->ndim) : "?") +
                                       ", expected " + want + " (batch, vocab)");
    if (out->strides &&
        ((d.vocab != 1 && out->strides[1] != 1) || (B != 1 && out->strides[0] != d.vocab)))
      throw Error(TSR_ERR_INVALID, "gpt2: predict logits must be contiguous row-major");
    const int32_t dt = out->device.device_type;
    const bool on_model = dt == device.device_type && out->device.device_id == device.device_id;
    if (!on_model && dt != kDLCPU && dt != kDLCUDAHost)
      throw Error(TSR_ERR_INVALID,
                  "gpt2: predict logits must be in host memory or on the model's device");
  }

  // Logits for the token after each sequence's last position: the trunk over
  // every position (attention needs them all), then ln_f and the LM head on
  // the B last rows only, over the real vocabulary (wte's first vocab rows).
  void predict(tsr_step *step, const tsr_batch *batch, DLTensor *out) {
    ready = false;
    if (out && !out->data) {  // the size query
      if (out->ndim != 2 || !out->shape)
        throw Error(TSR_ERR_INVALID, "gpt2: predict's size query needs logits of 2 dims");
      out->shape[1] = d.vocab;
      return;
    }
    const int64_t T = check_batch(batch, false);
    const int64_t B = batch->size;
    check_logits(out, B);
    if (B == 0) return;
    const int64_t C = d.width, V = d.vocab;
    tsr_host_ctx *ctx = host->ctx;
    DLTensor wte = trunk(step, batch->inputs, B, T);

    View last = A(dsmall, {B, C});
    for (int64_t b = 0; b < B; ++b) {
      View src = A(resid[L()] + static_cast<size_t>((b * T + T - 1) * C), {C});
      View dst = A(dsmall + static_cast<size_t>(b * C), {C});
      check(ops->copy(ctx, src.get(), dst.get()));
    }
    View y = A(lnf, {B, C}), m = S(lnf_m, {B}), s = S(lnf_s, {B});
    DLTensor w = param(step, lnf_w()), b = param(step, lnf_b());
    check(
        ops->layernorm_forward(ctx, last.get(), &w, &b, kLayerNormEps, y.get(), m.get(), s.get()));
    params_done(step, L() + 1);
    View head(wte, {V, C});  // the real vocabulary: wte's first V rows
    View z = A(logits, {B, V});
    check(ops->linear(ctx, y.get(), 0, head.get(), 1, nullptr, TSR_ACT_NONE, z.get(), nullptr));
    params_done(step, 0);

    // To the caller's float32 tensor: cast on the device, then copy across.
    const bool on_model =
        out->device.device_type == device.device_type && out->device.device_id == device.device_id;
    if (same_dtype(adt, sdk::dtype_f32())) {
      check(ops->copy(ctx, z.get(), out));
    } else if (on_model) {
      check(ops->cast(ctx, z.get(), out));
    } else {
      if (predict_f32.bytes() < static_cast<size_t>(B * V) * 4)
        predict_f32 =
            Buffer(host, device, static_cast<size_t>(max_batch * V) * 4, TSR_MEM_ACTIVATIONS);
      View zf(predict_f32.get(), 0, device, sdk::dtype_f32(), {B, V});
      check(ops->cast(ctx, z.get(), zf.get()));
      check(ops->copy(ctx, zf.get(), out));
    }
  }

  // ---- backward ------------------------------------------------------------

  // Block l's backward: dres holds d x_{l+1} on entry and d x_l on exit.
  void block_backward(tsr_step *step, uint32_t l, const Set &s, int64_t B, int64_t T) {
    const int64_t R = B * T, C = d.width, H = d.heads, D = C / H;
    tsr_host_ctx *ctx = host->ctx;
    const auto P = [&](BlockParam p) { return param(step, block_param(l, p)); };
    const auto train = [&](BlockParam p) { return trainable(block_param(l, p)); };
    const auto G = [&](BlockParam p) { return grad(step, block_param(l, p)); };
    View x = A(resid[l], {R, C}), dres_v = A(dres, {R, C}), dsm = A(dsmall, {R, C});
    View ln1 = A(s.ln1, {R, C}), atty = A(s.atty, {R, C});
    View r2 = A(s.r2, {R, C}), ln2 = A(s.ln2, {R, C});
    View fch = A(s.fch, {R, 4 * C}), fchg = A(s.fchg, {R, 4 * C});
    View m1 = S(s.m1, {R}), s1 = S(s.s1, {R}), m2 = S(s.m2, {R}), s2 = S(s.s2, {R});
    View lse = S(s.lse, {B, H, T});
    View dfc = A(dbig, {R, 4 * C}), dqkv = A(dbig, {R, 3 * C});

    // MLP: y = r + c_proj(gelu(c_fc(ln_2(r)))).
    if (train(kMlpProjW)) {
      DLTensor g = G(kMlpProjW);
      check(ops->matmul(ctx, fchg.get(), 1, dres_v.get(), 0, &g, 1.0f, 1.0f));
    }
    if (train(kMlpProjB)) {
      DLTensor g = G(kMlpProjB);
      check(ops->bias_grad(ctx, dres_v.get(), &g));
    }
    DLTensor w = P(kMlpProjW);
    check(ops->matmul(ctx, dres_v.get(), 0, &w, 1, dfc.get(), 1.0f, 0.0f));
    check(ops->act_backward(ctx, TSR_ACT_GELU, fch.get(), 0, dfc.get(), dfc.get()));
    if (train(kFcW)) {
      DLTensor g = G(kFcW);
      check(ops->matmul(ctx, ln2.get(), 1, dfc.get(), 0, &g, 1.0f, 1.0f));
    }
    if (train(kFcB)) {
      DLTensor g = G(kFcB);
      check(ops->bias_grad(ctx, dfc.get(), &g));
    }
    w = P(kFcW);
    check(ops->matmul(ctx, dfc.get(), 0, &w, 1, dsm.get(), 1.0f, 0.0f));
    {
      DLTensor lw = P(kLn2W);
      View gw = grad_or_discard(step, block_param(l, kLn2W), 0);
      View gb = grad_or_discard(step, block_param(l, kLn2B), 1);
      check(ops->layernorm_backward(ctx, dsm.get(), r2.get(), &lw, m2.get(), s2.get(), dres_v.get(),
                                    gw.get(), gb.get()));
    }

    // Attention: r = x + c_proj(attn(c_attn(ln_1(x)))).
    if (train(kAttnProjW)) {
      DLTensor g = G(kAttnProjW);
      check(ops->matmul(ctx, atty.get(), 1, dres_v.get(), 0, &g, 1.0f, 1.0f));
    }
    if (train(kAttnProjB)) {
      DLTensor g = G(kAttnProjB);
      check(ops->bias_grad(ctx, dres_v.get(), &g));
    }
    w = P(kAttnProjW);
    check(ops->matmul(ctx, dres_v.get(), 0, &w, 1, dsm.get(), 1.0f, 0.0f));
    {
      View q = qkv_part(s.qkv, B, T, 0), k = qkv_part(s.qkv, B, T, 1);
      View v = qkv_part(s.qkv, B, T, 2);
      View dq = qkv_part(dbig, B, T, 0), dk = qkv_part(dbig, B, T, 1);
      View dv = qkv_part(dbig, B, T, 2);
      View o = A(s.atty, {B, T, H, D}), dout = A(dsmall, {B, T, H, D});
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
      check(ops->attention_backward(ctx, q.get(), k.get(), v.get(), o.get(), dout.get(), lse.get(),
                                    scale, dq.get(), dk.get(), dv.get()));
    }
    if (train(kQkvW)) {
      DLTensor g = G(kQkvW);
      check(ops->matmul(ctx, ln1.get(), 1, dqkv.get(), 0, &g, 1.0f, 1.0f));
    }
    if (train(kQkvB)) {
      DLTensor g = G(kQkvB);
      check(ops->bias_grad(ctx, dqkv.get(), &g));
    }
    w = P(kQkvW);
    check(ops->matmul(ctx, dqkv.get(), 0, &w, 1, dsm.get(), 1.0f, 0.0f));
    {
      DLTensor lw = P(kLn1W);
      View gw = grad_or_discard(step, block_param(l, kLn1W), 0);
      View gb = grad_or_discard(step, block_param(l, kLn1B), 1);
      check(ops->layernorm_backward(ctx, dsm.get(), x.get(), &lw, m1.get(), s1.get(), dres_v.get(),
                                    gw.get(), gb.get()));
    }
  }

  void backward(tsr_step *step, const tsr_batch *batch, float loss_scale) {
    if (!ready)
      throw Error(TSR_ERR_INVALID,
                  "gpt2: backward needs a forward with training = 1 just before it");
    const int64_t T = check_batch(batch);
    const int64_t B = batch->size;
    if (B != ready_n || (B > 0 && T != ready_T))
      throw Error(TSR_ERR_INVALID, "gpt2: backward got " + std::to_string(B) + " x " +
                                       std::to_string(T) + " tokens, the forward before it had " +
                                       std::to_string(ready_n) + " x " + std::to_string(ready_T));
    ready = false;  // dlogits overwrite the logits: one backward per forward
    const uint32_t nL = L();
    const auto run = [&](int64_t stage) { return B > 0 && stage >= lowest_trainable_stage; };
    tsr_host_ctx *ctx = host->ctx;
    const int64_t R = B * T, C = d.width;

    if (run(nL + 1)) {
      View tgt(batch->targets, {R});
      View z = A(logits, {R, d.padded_vocab});
      double loss_sum = 0;
      int64_t count = 0;
      check(ops->cross_entropy(ctx, z.get(), tgt.get(), d.vocab, loss_scale, z.get(), &loss_sum,
                               &count, nullptr));
      // LM head: dwte += dlogits^T @ ln_f(x_L); d ln_f(x_L) = dlogits @ wte.
      View lnf_y = A(lnf, {R, C}), dsm = A(dsmall, {R, C});
      DLTensor wte = param(step, kWte);
      if (trainable(kWte)) {
        DLTensor g = grad(step, kWte);
        check(ops->matmul(ctx, z.get(), 1, lnf_y.get(), 0, &g, 1.0f, 1.0f));
      }
      check(ops->matmul(ctx, z.get(), 0, &wte, 0, dsm.get(), 1.0f, 0.0f));
      // ln_f; dres becomes d x_L.
      View dres_v = A(dres, {R, C}), xL = A(resid[nL], {R, C});
      check(ops->fill(ctx, dres_v.get(), 0.0f));
      View m = S(lnf_m, {R}), s = S(lnf_s, {R});
      DLTensor w = param(step, lnf_w());
      View gw = grad_or_discard(step, lnf_w(), 0);
      View gb = grad_or_discard(step, lnf_b(), 1);
      check(ops->layernorm_backward(ctx, dsm.get(), xL.get(), &w, m.get(), s.get(), dres_v.get(),
                                    gw.get(), gb.get()));
    }
    check(host->grads_done(step, nL + 1));

    for (uint32_t l = nL; l-- > 0;) {
      if (run(l + 1)) {
        const Set &s = sets[recompute ? 0 : l];
        if (recompute) block_forward(step, l, s, B, T, false);
        block_backward(step, l, s, B, T);
      }
      check(host->grads_done(step, l + 1));
    }

    if (run(0)) {
      View dres_v = A(dres, {R, C});
      if (trainable(kWte)) {
        View ids(batch->inputs, {R});
        DLTensor g = grad(step, kWte);
        check(ops->embedding_backward(ctx, ids.get(), dres_v.get(), &g));
      }
      if (trainable(kWpe)) {
        DLTensor g = grad(step, kWpe);
        View pos(g, {T * C});
        for (int64_t b = 0; b < B; ++b) {
          View db = A(dres + static_cast<size_t>(b * T * C), {T * C});
          check(ops->axpy(ctx, 1.0f, db.get(), pos.get()));
        }
      }
    }
    check(host->grads_done(step, 0));
  }

  // ---- FLOPs ---------------------------------------------------------------

  // Per sample of T tokens: 6 N T + 6 L C T^2, i.e. per token 6 N (a multiply
  // -add per parameter, forward and twice backward) plus 6 L C T for the
  // causal attention scores and their use (QK^T and AV, 2 x 2 C T per token
  // forward halved by the causal mask, times 3 for backward). N counts every
  // declared parameter, embeddings included (wte at its padded size: the LM
  // head's matmul multiplies all of it).
  double flops_per_sample() const {
    double N = 0;
    for (const tsr_param_info &p : infos) {
      double n = 1;
      for (int32_t k = 0; k < p.ndim; ++k) n *= static_cast<double>(p.shape[k]);
      N += n;
    }
    const double T = static_cast<double>(data_T);
    return 6.0 * N * T + 6.0 * static_cast<double>(d.layers * d.width) * T * T;
  }
};

// ---- create -----------------------------------------------------------------

Gpt2 *build(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init) {
  if (!host || !host->ops || !host->run)
    throw Error(TSR_ERR_INVALID, "gpt2: incomplete host table");
  if (!TSR_HAS_FIELD(host->ops, tsr_ops, attention_backward) || !host->ops->linear ||
      !host->ops->layernorm_forward || !host->ops->embedding_forward ||
      !host->ops->attention_forward)
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: the host's ops table lacks the ABI 1.1 ops (linear, layernorm, embedding, "
                "attention) the gpt2 model computes with");
  if (!init || !init->data) throw Error(TSR_ERR_INVALID, "gpt2: no model init or data info");
  const tsr_data_info &data = *init->data;
  sdk::Config c(host, cfg);

  auto m = std::make_unique<Gpt2>();
  m->host = host;
  m->ops = host->ops;
  m->device = host->run->device;
  m->recompute = c.get_bool("recompute");
  Dims &d = m->d;
  d.layers = c.get_int("layers");
  d.heads = c.get_int("heads");
  d.width = c.get_int("width");
  d.context = c.get_int("context");
  d.vocab = c.get_int("vocab");
  const int64_t pad_to = c.get_int("vocab_pad_to");
  const double init_std = c.get_float("init_std");
  const std::string init_from = c.get_string("init_from");
  const std::vector<std::string> freeze = c.get_string_array("freeze");
  for (const auto &[v, key] :
       {std::pair{d.layers, "layers"}, std::pair{d.heads, "heads"}, std::pair{d.width, "width"},
        std::pair{d.context, "context"}, std::pair{d.vocab, "vocab"}})
    if (v < 0)
      throw Error(TSR_ERR_CONFIG,
                  std::string("gpt2: ") + key + " = " + std::to_string(v) + " is negative");
  if (pad_to < 1)
    throw Error(TSR_ERR_CONFIG, "gpt2: vocab_pad_to = " + std::to_string(pad_to) + " is below 1");
  if (!(init_std >= 0) || !std::isfinite(init_std))
    throw Error(TSR_ERR_CONFIG, "gpt2: init_std must be a finite number >= 0");

  // Dimensions: init_from's config.json wins; an explicit key that says
  // otherwise is an error. Without init_from, unset keys are GPT-2 small's.
  std::unique_ptr<HfCheckpoint> ck;
  if (!init_from.empty()) {
    ck = std::make_unique<HfCheckpoint>(open_checkpoint(init_from));
    const std::string &f = ck->config_path;
    merge_dim(d.layers, ck->dims.layers, "layers", "n_layer", f);
    merge_dim(d.heads, ck->dims.heads, "heads", "n_head", f);
    merge_dim(d.width, ck->dims.width, "width", "n_embd", f);
    merge_dim(d.context, ck->dims.context, "context", "n_positions", f);
    merge_dim(d.vocab, ck->dims.vocab, "vocab", "vocab_size", f);
  } else {
    if (d.layers == 0) d.layers = 12;
    if (d.heads == 0) d.heads = 12;
    if (d.width == 0) d.width = 768;
    if (d.context == 0) d.context = 1024;
    if (d.vocab == 0) d.vocab = 50257;
  }
  for (const auto &[v, key] :
       {std::pair{d.layers, "layers"}, std::pair{d.heads, "heads"}, std::pair{d.width, "width"},
        std::pair{d.context, "context"}, std::pair{d.vocab, "vocab"}})
    if (v < 1) throw Error(TSR_ERR_CONFIG, std::string("gpt2: ") + key + " must be at least 1");
  if (d.width % d.heads != 0)
    throw Error(TSR_ERR_CONFIG, "gpt2: width " + std::to_string(d.width) +
                                    " is not a multiple of heads " + std::to_string(d.heads));
  d.padded_vocab = (d.vocab + pad_to - 1) / pad_to * pad_to;

  // What the dataset gives: int32 token windows, inputs and targets [T].
  if (data.input_ndim != 1 || !is_i32(data.input_dtype))
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: the dataset's samples are " + dtype_str(data.input_dtype) + " " +
                    shape_str(data.input_shape, std::clamp(data.input_ndim, 0, 8)) +
                    "; the gpt2 model takes windows of int32 token ids [T] (the tokens dataset)");
  if (data.target_ndim != 1 || !is_i32(data.target_dtype) ||
      data.target_shape[0] != data.input_shape[0])
    throw Error(TSR_ERR_UNSUPPORTED,
                "gpt2: the dataset's targets are " + dtype_str(data.target_dtype) + " " +
                    shape_str(data.target_shape, std::clamp(data.target_ndim, 0, 8)) +
                    "; the gpt2 model needs one int32 target token per input token [" +
                    std::to_string(data.input_shape[0]) + "]");
  m->data_T = data.input_shape[0];
  if (m->data_T < 1 || m->data_T > d.context)
    throw Error(TSR_ERR_CONFIG, "gpt2: the dataset's windows have " + std::to_string(m->data_T) +
                                    " tokens; the model's context is " + std::to_string(d.context));
  if (data.num_classes > d.vocab)
    throw Error(TSR_ERR_CONFIG, "gpt2: the dataset has " + std::to_string(data.num_classes) +
                                    " token ids; the model's vocab is " + std::to_string(d.vocab));
  if (init->max_micro_batch < 1)
    throw Error(TSR_ERR_INVALID,
                "gpt2: max_micro_batch is " + std::to_string(init->max_micro_batch));
  m->max_batch = init->max_micro_batch;

  // Parameters.
  const int64_t C = d.width;
  const float proj_std =
      static_cast<float>(init_std / std::sqrt(2.0 * static_cast<double>(d.layers)));
  auto declare = [&](std::string name, std::initializer_list<int64_t> shape, uint32_t group,
                     tsr_init rule, float std_) {
    m->names.push_back(std::move(name));
    tsr_param_info p = sdk::make<tsr_param_info>();
    p.name = m->names.back().c_str();
    p.ndim = static_cast<int32_t>(shape.size());
    std::copy(shape.begin(), shape.end(), p.shape);
    p.group = group;
    p.init = rule;
    p.init_a = 0.0f;
    p.init_b = rule == TSR_INIT_NORMAL ? std_ : 0.0f;
    p.trainable = 1;
    p.decay = p.ndim >= 2 ? 1 : 0;  // matrices and embeddings; not biases or norms
    m->infos.push_back(p);
  };
  const float std0 = static_cast<float>(init_std);
  // wte: [padded_vocab, C]; rows >= vocab are padding, trimmed on export.
  declare("transformer.wte.weight", {d.padded_vocab, C}, 0, TSR_INIT_NORMAL, std0);
  declare("transformer.wpe.weight", {d.context, C}, 0, TSR_INIT_NORMAL, std0);
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string pre = "transformer.h." + std::to_string(l) + ".";
    const uint32_t g = static_cast<uint32_t>(l + 1);
    declare(pre + kBlockNames[kLn1W], {C}, g, TSR_INIT_ONES, 0);
    declare(pre + kBlockNames[kLn1B], {C}, g, TSR_INIT_ZEROS, 0);
    declare(pre + kBlockNames[kQkvW], {C, 3 * C}, g, TSR_INIT_NORMAL, std0);
    declare(pre + kBlockNames[kQkvB], {3 * C}, g, TSR_INIT_ZEROS, 0);
    declare(pre + kBlockNames[kAttnProjW], {C, C}, g, TSR_INIT_NORMAL, proj_std);
    declare(pre + kBlockNames[kAttnProjB], {C}, g, TSR_INIT_ZEROS, 0);
    declare(pre + kBlockNames[kLn2W], {C}, g, TSR_INIT_ONES, 0);
    declare(pre + kBlockNames[kLn2B], {C}, g, TSR_INIT_ZEROS, 0);
    declare(pre + kBlockNames[kFcW], {C, 4 * C}, g, TSR_INIT_NORMAL, std0);
    declare(pre + kBlockNames[kFcB], {4 * C}, g, TSR_INIT_ZEROS, 0);
    declare(pre + kBlockNames[kMlpProjW], {4 * C, C}, g, TSR_INIT_NORMAL, proj_std);
    declare(pre + kBlockNames[kMlpProjB], {C}, g, TSR_INIT_ZEROS, 0);
  }
  const uint32_t gf = static_cast<uint32_t>(d.layers + 1);
  declare("transformer.ln_f.weight", {C}, gf, TSR_INIT_ONES, 0);
  declare("transformer.ln_f.bias", {C}, gf, TSR_INIT_ZEROS, 0);

  // freeze: every pattern must name at least one parameter.
  for (const std::string &pat : freeze) {
    size_t hits = 0;
    for (tsr_param_info &p : m->infos)
      if (glob_match(pat.c_str(), p.name)) {
        p.trainable = 0;
        ++hits;
      }
    if (hits == 0)
      throw Error(TSR_ERR_CONFIG, "gpt2: freeze pattern '" + pat +
                                      "' matches no parameter (names look like "
                                      "'transformer.h.0.attn.c_attn.weight'; * matches any run)");
  }
  // The lowest backward stage with a trainable parameter (wte counts for the
  // embeddings, stage 0; the LM head always runs when anything trains).
  m->lowest_trainable_stage = d.layers + 2;
  for (size_t i = 0; i < m->infos.size(); ++i) {
    if (!m->infos[i].trainable) continue;
    const int64_t stage = static_cast<int64_t>(m->infos[i].group);  // group == stage
    m->lowest_trainable_stage = std::min(m->lowest_trainable_stage, stage);
  }

  // init_from: the engine overlays the file's tensors on the declared
  // initialisers by parameter name (engine/train/init_from.cpp: a tensor with
  // fewer rows fills the first rows, so wte's padding keeps its initialiser).
  // Checked here too, so a wrong checkpoint fails at create with the model's
  // view of it: every parameter present under its Hugging Face name, in the
  // Hugging Face shape (wte unpadded or already padded), in a dtype the
  // engine converts.
  if (ck) {
    const auto &hdr = ck->header;
    for (const tsr_param_info &p : m->infos) {
      const std::string name = p.name;
      auto it = hdr.find(name);
      if (it == hdr.end() || !it->is_object() || !it->contains("shape")) {
        const std::string bare = name.substr(std::strlen("transformer."));
        throw Error(TSR_ERR_INVALID,
                    "gpt2: " + ck->weights_path + " has no tensor '" + name + "'" +
                        (hdr.contains(bare)
                             ? " (it has '" + bare +
                                   "': a GPT2Model checkpoint without the 'transformer.' prefix, "
                                   "which init_from does not rename)"
                             : std::string()));
      }
      const std::vector<int64_t> shape = (*it)["shape"].get<std::vector<int64_t>>();
      const std::vector<int64_t> declared(p.shape, p.shape + p.ndim);
      std::vector<int64_t> hf = declared;
      if (name == "transformer.wte.weight") hf[0] = d.vocab;
      if (shape != hf && shape != declared)
        throw Error(TSR_ERR_INVALID,
                    "gpt2: " + ck->weights_path + ": '" + name + "' is " +
                        shape_str(shape.data(), static_cast<int32_t>(shape.size())) +
                        ", the model declares " + shape_str(hf.data(), p.ndim));
      const std::string dt = it->value("dtype", "");
      if (dt != "F32" && dt != "F16" && dt != "BF16")
        throw Error(TSR_ERR_UNSUPPORTED, "gpt2: " + ck->weights_path + ": '" + name +
                                             "' has dtype " + dt + " (F32, F16 or BF16 expected)");
    }
    const std::string msg = "gpt2: init_from " + ck->dir +
                            ": dimensions from config.json; the weights of model.safetensors "
                            "(all " +
                            std::to_string(m->infos.size()) +
                            " parameters present) are loaded "
                            "over the initialisers by the engine";
    host->log(host->ctx, TSR_LOG_INFO, msg.c_str());
  }

  m->plan_memory();
  m->allocate(compute_dtype(*host->run));

  if (host->log) {
    double total = 0, frozen = 0;
    for (const tsr_param_info &p : m->infos) {
      double n = 1;
      for (int32_t k = 0; k < p.ndim; ++k) n *= static_cast<double>(p.shape[k]);
      total += n;
      if (!p.trainable) frozen += n;
    }
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "gpt2: %lld layers, %lld heads, width %lld, context %lld, vocab %lld (padded "
                  "to %lld), %.0f parameters (%.0f frozen), activations %.1f MiB (%s)",
                  static_cast<long long>(d.layers), static_cast<long long>(d.heads),
                  static_cast<long long>(d.width), static_cast<long long>(d.context),
                  static_cast<long long>(d.vocab), static_cast<long long>(d.padded_vocab), total,
                  frozen,
                  static_cast<double>(m->act.bytes() + m->stats.bytes()) / (1024.0 * 1024.0),
                  m->recompute ? "recompute" : "stored");
    host->log(host->ctx, TSR_LOG_INFO, buf);
  }
  return m.release();
}

// --- the vtable: every entry guarded -----------------------------------------

tsr_status gpt2_create(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init,
                       void **out_self) {
  return sdk::guard(host, [&] {
    if (!out_self) throw Error(TSR_ERR_INVALID, "gpt2: out_self is NULL");
    *out_self = nullptr;
    *out_self = build(host, cfg, init);
  });
}

void gpt2_destroy(void *self) {
  Gpt2 *m = static_cast<Gpt2 *>(self);
  if (!m) return;
  const tsr_host *host = m->host;
  (void)sdk::guard(host, [&] { delete m; });
}

size_t gpt2_num_params(void *self) {
  const Gpt2 *m = static_cast<const Gpt2 *>(self);
  return m ? m->infos.size() : 0;
}

tsr_status gpt2_param_info(void *self, size_t index, tsr_param_info *out) {
  Gpt2 *m = static_cast<Gpt2 *>(self);
  if (!m) return TSR_ERR_INVALID;
  return sdk::guard(m->host, [&] {
    if (!out) throw Error(TSR_ERR_INVALID, "gpt2: param_info out is NULL");
    if (index >= m->infos.size())
      throw Error(TSR_ERR_INVALID, "gpt2: parameter index " + std::to_string(index) +
                                       " out of range (the model has " +
                                       std::to_string(m->infos.size()) + ")");
    const size_t size = out->struct_size ? out->struct_size : sizeof *out;
    *out = m->infos[index];
    out->struct_size = size;
  });
}

tsr_status gpt2_forward(void *self, tsr_step *step, const tsr_batch *batch, int32_t training,
                        tsr_forward_result *out) {
  Gpt2 *m = static_cast<Gpt2 *>(self);
  if (!m) return TSR_ERR_INVALID;
  return sdk::guard(m->host, [&] { m->forward(step, batch, training, out); });
}

tsr_status gpt2_backward(void *self, tsr_step *step, const tsr_batch *batch, float loss_scale) {
  Gpt2 *m = static_cast<Gpt2 *>(self);
  if (!m) return TSR_ERR_INVALID;
  return sdk::guard(m->host, [&] { m->backward(step, batch, loss_scale); });
}

tsr_status gpt2_predict(void *self, tsr_step *step, const tsr_batch *batch, DLTensor *logits) {
  Gpt2 *m = static_cast<Gpt2 *>(self);
  if (!m) return TSR_ERR_INVALID;
  return sdk::guard(m->host, [&] { m->predict(step, batch, logits); });
}

double gpt2_flops_per_sample(void *self) {
  const Gpt2 *m = static_cast<const Gpt2 *>(self);
  return m ? m->flops_per_sample() : 0.0;
}

const tsr_param_decl kParams[] = {
    sdk::param_min("layers", TSR_PARAM_INT, "0",
                   "Transformer blocks (n_layer); 0: init_from's config.json, else 12", 0),
    sdk::param_min("heads", TSR_PARAM_INT, "0",
                   "Attention heads (n_head); 0: init_from's config.json, else 12", 0),
    sdk::param_min("width", TSR_PARAM_INT, "0",
                   "Embedding width (n_embd), a multiple of heads; 0: init_from's config.json, "
                   "else 768",
                   0),
    sdk::param_min("context", TSR_PARAM_INT, "0",
                   "Longest sequence (n_positions, the rows of wpe); 0: init_from's config.json, "
                   "else 1024",
                   0),
    sdk::param_min("vocab", TSR_PARAM_INT, "0",
                   "Vocabulary size (vocab_size); 0: init_from's config.json, else 50257", 0),
    sdk::param_min("vocab_pad_to", TSR_PARAM_INT, "64",
                   "wte gets vocab rounded up to a multiple of this many rows (50257 -> 50304); "
                   "padding rows are kept out of the loss and trimmed on export",
                   1),
    sdk::param("init_from", TSR_PARAM_STRING, "\"\"",
               "A Hugging Face GPT-2 directory (config.json + model.safetensors): its "
               "config.json sets the dimensions (an explicit key that disagrees is an error) "
               "and its weights the initial parameters"),
    sdk::param("freeze", TSR_PARAM_STRING_ARRAY, "[]",
               "Parameter name patterns (* matches any run, ? one character) to freeze: no "
               "gradient, no optimizer state; e.g. [\"transformer.wte.weight\", "
               "\"transformer.h.0.*\"]"),
    sdk::param("recompute", TSR_PARAM_BOOL, "false",
               "Keep only each block's input and recompute its activations in backward "
               "(activation checkpointing): less memory, one more block forward per block"),
    sdk::param_min("init_std", TSR_PARAM_FLOAT, "0.02",
                   "std of the initial weights; c_proj weights get init_std / sqrt(2 * layers) "
                   "(GPT-2's scaled init); biases zero, LayerNorm weights one",
                   0.0),
};

const tsr_model_vtable kVtable = {
    sizeof(tsr_model_vtable),
    gpt2_create,
    gpt2_destroy,
    gpt2_num_params,
    gpt2_param_info,
    gpt2_forward,
    gpt2_backward,
    gpt2_flops_per_sample,
    gpt2_predict,
};

const tsr_plugin_descriptor kDescriptor = {
    sizeof(tsr_plugin_descriptor),
    TSR_KIND_MODEL,
    "gpt2",
    "1.0.0",
    "GPT-2 language model (Hugging Face names and layouts, tied LM head, pre-LayerNorm)",
    kParams,
    std::size(kParams),
    TSR_DEVICE_CPU | TSR_DEVICE_CUDA,
    &kVtable,
};

const tsr_plugin_descriptor *const kPlugins[] = {&kDescriptor};

const tsr_plugin_library kLibrary = {
    sizeof(tsr_plugin_library), TSR_ABI_MAJOR, TSR_ABI_MINOR, kPlugins, std::size(kPlugins),
};

}  // namespace

TSR_PLUGIN_ENTRY {
  return &kLibrary;
}
