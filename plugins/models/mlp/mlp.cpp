// The mlp model plugin: a multi-layer perceptron for classification, laid out
// like torch's nn.Sequential(Linear, act, Linear, act, ..., Linear) so its
// parameter names and shapes ("0.weight" [out, in], "0.bias" [out], "2.weight"
// ...) match a PyTorch state_dict. Softmax cross-entropy is the loss.
//
// Everything numeric goes through host->ops on tensors on the run's device;
// the plugin never reads or writes tensor data itself, so the same code runs
// wherever the ops do (CPU today, CUDA with the CUDA ops).
//
// Per layer i (0-based, L layers, d[0] = inputs, d[L] = classes):
//   forward:  Z_i = X_i @ W_i^T + b_i,  A_i = act(Z_i)  (no act on the last)
//   backward: dW_i += dZ_i^T @ X_i,  db_i += colsum(dZ_i),  dX_i = dZ_i @ W_i,
//             dZ_{i-1} = dX_i * act'(.)
// Activation memory kept between forward and backward: A_i of every hidden
// layer (relu and tanh differentiate from their output, so Z_i is not kept),
// plus Z_i for gelu, the logits (which backward overwrites with dlogits) and
// two ping-pong buffers for dX.
#include <tessera/tessera.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tessera/cpp/model.hpp>
#include <tessera/cpp/plugin.hpp>
#include <tessera/cpp/tensor.hpp>
#include <vector>

namespace {

// What `tessera plugins` says of it (the descriptor's summary).
constexpr const char *kSummary =
    "Multi-layer perceptron classifier (Linear + relu/gelu/tanh, softmax cross-entropy)";

namespace sdk = tessera::sdk;

// The widest hidden layer (2^24 units): two such layers already hold 2^48
// parameters, so no product of widths overflows.
constexpr int64_t kMaxWidth = int64_t{1} << 24;
using sdk::Buffer;
using sdk::check;
using sdk::dtype_name;
using sdk::Error;

bool is_dtype(DLDataType t, uint8_t code, uint8_t bits) {
  return t.code == code && t.bits == bits && t.lanes == 1;
}

std::string shape_str(const DLTensor &t) {
  std::string s = "[";
  for (int32_t i = 0; i < t.ndim; ++i) {
    if (i) s += ", ";
    s += t.shape ? std::to_string(t.shape[i]) : "?";
  }
  return s + "]";
}

// A contiguous 1-D or 2-D view that owns its shape. get() re-points the
// DLTensor at this object's shape, so views may be copied freely.
class View {
 public:
  // Over a buffer of ours.
  View(void *data, DLDevice device, DLDataType dtype, int64_t rows, int64_t cols) {
    std::memset(&t_, 0, sizeof t_);
    t_.data = data;
    t_.device = device;
    t_.dtype = dtype;
    t_.ndim = 2;
    shape_[0] = rows;
    shape_[1] = cols;
  }
  // The same memory as `base` (data, offset, device, dtype) with a new shape.
  View(const DLTensor &base, int32_t ndim, int64_t d0, int64_t d1 = 1) {
    std::memset(&t_, 0, sizeof t_);
    t_.data = base.data;
    t_.byte_offset = base.byte_offset;
    t_.device = base.device;
    t_.dtype = base.dtype;
    t_.ndim = ndim;
    shape_[0] = d0;
    shape_[1] = d1;
  }
  DLTensor *get() {
    t_.shape = shape_;
    t_.strides = nullptr;
    return &t_;
  }

 private:
  int64_t shape_[2] = {0, 0};
  DLTensor t_;
};

const char *act_name(tsr_activation a) {
  return a == TSR_ACT_RELU   ? "relu"
         : a == TSR_ACT_GELU ? "gelu"
         : a == TSR_ACT_TANH ? "tanh"
                             : "none";
}

struct Mlp {
  static constexpr const char *kName = "mlp";  // for messages
  const tsr_host *host = nullptr;
  const tsr_ops *ops = nullptr;
  DLDevice device{kDLCPU, 0};
  // The compute dtype (the run's precision): parameters, gradients and
  // activations; batch inputs arrive as float32 and are cast on entry.
  DLDataType dtype{kDLFloat, 32, 1};
  size_t esize = 4;
  bool has_11 = false;  // the host's ops have ABI 1.1's cast and linear
  tsr_activation act = TSR_ACT_RELU;
  std::vector<int64_t> dims;  // d[0] = inputs, d[1..L-1] = hidden, d[L] = classes
  int64_t max_batch = 0;
  std::vector<std::string> names;
  std::vector<tsr_param_info> infos;
  double weight_elems = 0;

  std::vector<Buffer> post;  // A_i, i < L-1: hidden outputs after the activation
  std::vector<Buffer> pre;   // Z_i, gelu only: hidden outputs before it
  Buffer logits;             // [M, classes]; backward turns it into dlogits
  Buffer input;              // [M, d0] in the compute dtype, when it is not float32
  Buffer scratch[2];         // [M, max hidden]: dX ping-pong in backward
  Buffer predict_f32;        // [M, classes] float32: predict's logits in 16-bit runs

  // What backward may rely on: a training forward over `ready_n` samples.
  bool ready = false;
  int64_t ready_n = 0;

  size_t layers() const { return dims.size() - 1; }
  // 2 FLOPs per multiply-add forward, 4 backward (dW and dX).
  double flops_per_sample() const { return 6.0 * weight_elems; }
  int64_t classes() const { return dims.back(); }
  static DLDataType f32() { return sdk::dtype_f32(); }

  View buf(const Buffer &b, int64_t rows, int64_t cols) const {
    return View(b.get(), device, dtype, rows, cols);
  }
  // X_i: the batch inputs as [n, d0] for layer 0 (cast to the compute dtype
  // by forward when that is not float32), else the previous output.
  View layer_input(size_t i, const tsr_batch &batch, int64_t n) const {
    if (i == 0) return input.get() ? buf(input, n, dims[0]) : View(batch.inputs, 2, n, dims[0]);
    return buf(post[i - 1], n, dims[i]);
  }
  // Z = act(X W^T + b): one fused op where the host has it.
  void linear(View &in, DLTensor &w, DLTensor &b, tsr_activation a, View &out, View *pre_out) {
    if (has_11) {
      check(ops->linear(host->ctx, in.get(), 0, &w, 1, &b, a, out.get(),
                        pre_out ? pre_out->get() : nullptr));
      return;
    }
    View &z = pre_out ? *pre_out : out;
    check(ops->matmul(host->ctx, in.get(), 0, &w, 1, z.get(), 1.0f, 0.0f));
    check(ops->bias_act(host->ctx, z.get(), &b, pre_out ? TSR_ACT_NONE : a));
    if (pre_out) check(ops->act_forward(host->ctx, a, z.get(), out.get()));
  }

  DLTensor param(tsr_step *step, uint32_t index) const {
    DLTensor t;
    std::memset(&t, 0, sizeof t);
    check(host->param(step, index, &t));
    check_param_view(t, index, "parameter");
    return t;
  }
  DLTensor grad(tsr_step *step, uint32_t index) const {
    DLTensor t;
    std::memset(&t, 0, sizeof t);
    check(host->grad(step, index, &t));
    check_param_view(t, index, "gradient");
    return t;
  }
  void check_param_view(const DLTensor &t, uint32_t index, const char *what) const {
    const tsr_param_info &p = infos[index];
    int64_t want = 1, got = 1;
    for (int32_t d = 0; d < p.ndim; ++d) want *= p.shape[d];
    for (int32_t d = 0; d < t.ndim; ++d) got *= t.shape ? t.shape[d] : -1;
    if (got != want)
      throw Error(TSR_ERR_INTERNAL, std::string("mlp: the host's ") + what + " view of '" + p.name +
                                        "' is " + shape_str(t) + ", expected " +
                                        std::to_string(want) + " elements");
  }

  // Checks a batch tensor against what the model was built for and returns it
  // as a compact [n, cols] (or [n] when cols == 0) view.
  View batch_view(const DLTensor &t, const char *what, int64_t n, int64_t cols) const {
    if (t.device.device_type != device.device_type || t.device.device_id != device.device_id)
      throw Error(TSR_ERR_INVALID, std::string("mlp: batch ") + what + " are on device type " +
                                       std::to_string(t.device.device_type) + ":" +
                                       std::to_string(t.device.device_id) + ", the model runs on " +
                                       std::to_string(device.device_type) + ":" +
                                       std::to_string(device.device_id));
    int64_t numel = 1;
    for (int32_t d = 0; d < t.ndim; ++d) numel *= t.shape ? t.shape[d] : -1;
    const int64_t want = n * (cols ? cols : 1);
    if (t.ndim < 1 || numel != want || (t.shape && t.shape[0] != n))
      throw Error(TSR_ERR_INVALID, std::string("mlp: batch ") + what + " are " + shape_str(t) +
                                       ", expected " + std::to_string(n) + " samples of " +
                                       std::to_string(cols ? cols : 1) + " values");
    if (t.strides) {
      int64_t expect = 1;
      for (int32_t d = t.ndim - 1; d >= 0; --d) {
        if (t.shape[d] != 1 && t.strides[d] != expect)
          throw Error(TSR_ERR_INVALID,
                      std::string("mlp: batch ") + what + " must be contiguous row-major");
        expect *= t.shape[d];
      }
    }
    return cols ? View(t, 2, n, cols) : View(t, 1, n);
  }

  // predict passes with_targets = false: its targets may be absent.
  void check_batch(const tsr_batch *batch, bool with_targets = true) const {
    if (!batch) throw Error(TSR_ERR_INVALID, "mlp: batch is NULL");
    if (batch->size < 0 || batch->size > max_batch)
      throw Error(TSR_ERR_INVALID, "mlp: batch of " + std::to_string(batch->size) +
                                       " samples; the model was built for at most " +
                                       std::to_string(max_batch));
    if (!is_dtype(batch->inputs.dtype, kDLFloat, 32))
      throw Error(TSR_ERR_INVALID,
                  "mlp: batch inputs must be float32, got " + dtype_name(batch->inputs.dtype));
    if (with_targets && !is_dtype(batch->targets.dtype, kDLInt, 32))
      throw Error(TSR_ERR_INVALID,
                  "mlp: batch targets must be int32, got " + dtype_name(batch->targets.dtype));
  }

  void forward(tsr_step *step, const tsr_batch *batch, int32_t training, tsr_forward_result *out) {
    ready = false;
    check_batch(batch);
    if (!out) throw Error(TSR_ERR_INVALID, "mlp: forward result is NULL");
    const int64_t n = batch->size;
    double loss_sum = 0;
    int64_t count = 0, correct = 0;
    if (n > 0) {
      View y = batch_view(batch->targets, "targets", n, 0);
      layers_forward(step, *batch, n, training && act == TSR_ACT_GELU);
      View z = buf(logits, n, classes());
      check(ops->cross_entropy(host->ctx, z.get(), y.get(), classes(), 1.0f, nullptr, &loss_sum,
                               &count, &correct));
    }
    out->loss_sum = loss_sum;
    out->count = count;
    out->correct = correct;
    ready = training != 0;
    ready_n = n;
  }

  // The logits of each sample, float32 [n, classes], into the caller's
  // tensor (host memory or the model's device).
  void predict(tsr_step *step, const tsr_batch *batch, DLTensor *out) {
    ready = false;
    if (out && !out->data) {  // the size query
      if (out->ndim != 2 || !out->shape)
        throw Error(TSR_ERR_INVALID, "mlp: predict's size query needs logits of 2 dims");
      out->shape[1] = classes();
      return;
    }
    check_batch(batch, false);
    if (!out) throw Error(TSR_ERR_INVALID, "mlp: predict logits is NULL");
    const int64_t n = batch->size;
    if (!is_dtype(out->dtype, kDLFloat, 32))
      throw Error(TSR_ERR_INVALID,
                  "mlp: predict logits must be float32, got " + dtype_name(out->dtype));
    if (out->ndim != 2 || !out->shape || out->shape[0] != n || out->shape[1] != classes())
      throw Error(TSR_ERR_INVALID, "mlp: predict logits are " + shape_str(*out) + ", expected [" +
                                       std::to_string(n) + ", " + std::to_string(classes()) + "]");
    const int32_t dt = out->device.device_type;
    const bool on_model = dt == device.device_type && out->device.device_id == device.device_id;
    if (!on_model && dt != kDLCPU && dt != kDLCUDAHost)
      throw Error(TSR_ERR_INVALID,
                  "mlp: predict logits must be in host memory or on the model's device");
    if (n == 0) return;
    layers_forward(step, *batch, n, false);
    View z = buf(logits, n, classes());
    if (is_dtype(dtype, kDLFloat, 32)) {
      check(ops->copy(host->ctx, z.get(), out));
    } else if (on_model) {
      check(ops->cast(host->ctx, z.get(), out));
    } else {
      // Cast on the device, then copy across.
      if (!predict_f32.get())
        predict_f32 = Buffer(host, device, static_cast<size_t>(max_batch * classes()) * 4,
                             TSR_MEM_ACTIVATIONS);
      View zf(predict_f32.get(), device, f32(), n, classes());
      check(ops->cast(host->ctx, z.get(), zf.get()));
      check(ops->copy(host->ctx, zf.get(), out));
    }
  }

  // Every layer over n samples; the last layer's output lands in `logits`.
  void layers_forward(tsr_step *step, const tsr_batch &batch, int64_t n, bool keep_pre) {
    View x = batch_view(batch.inputs, "inputs", n, dims[0]);
    if (input.get()) {
      View xc = buf(input, n, dims[0]);
      check(ops->cast(host->ctx, x.get(), xc.get()));
    }
    const size_t L = layers();
    for (size_t i = 0; i < L; ++i) {
      const uint32_t wi = static_cast<uint32_t>(2 * i);
      DLTensor w = param(step, wi), b = param(step, wi + 1);
      View in = layer_input(i, batch, n);
      const int64_t width = dims[i + 1];
      if (i + 1 == L) {
        View z = buf(logits, n, width);
        linear(in, w, b, TSR_ACT_NONE, z, nullptr);
      } else if (keep_pre) {
        View z = buf(pre[i], n, width), a = buf(post[i], n, width);
        linear(in, w, b, act, a, &z);
      } else {
        View a = buf(post[i], n, width);
        linear(in, w, b, act, a, nullptr);
      }
      // Layer i's parameters are not needed again in this pass (stage 3
      // releases the gathered group). Hosts before params_done existed
      // have no such entry.
      if (TSR_HAS_FIELD(host, tsr_host, params_done) && host->params_done)
        check(host->params_done(step, static_cast<uint32_t>(i)));
    }
  }

  void backward(tsr_step *step, const tsr_batch *batch, float loss_scale) {
    check_batch(batch);
    if (!ready)
      throw Error(TSR_ERR_INVALID,
                  "mlp: backward needs a forward with training = 1 just before it");
    if (batch->size != ready_n)
      throw Error(TSR_ERR_INVALID, "mlp: backward got a batch of " + std::to_string(batch->size) +
                                       " samples, the forward before it had " +
                                       std::to_string(ready_n));
    ready = false;  // dlogits overwrite the logits: one backward per forward
    // ABI 1.5: where every gradient began this pass at zero, the weight
    // gradient (its one contribution) is written, not added: same values,
    // and the matmul reads no old gradient.
    const float wgrad_beta = sdk::first_grad_beta(host, step);
    const int64_t n = batch->size;
    const size_t L = layers();
    if (n == 0) {  // nothing to add; the groups are still final
      for (size_t i = L; i-- > 0;) check(host->grads_done(step, static_cast<uint32_t>(i)));
      return;
    }
    (void)batch_view(batch->inputs, "inputs", n, dims[0]);
    View y = batch_view(batch->targets, "targets", n, 0);
    View dz = buf(logits, n, classes());
    double loss_sum = 0;
    int64_t count = 0;
    check(ops->cross_entropy(host->ctx, dz.get(), y.get(), classes(), loss_scale, dz.get(),
                             &loss_sum, &count, nullptr));
    int k = 0;
    for (size_t i = L; i-- > 0;) {
      const uint32_t wi = static_cast<uint32_t>(2 * i);
      View in = layer_input(i, *batch, n);
      DLTensor gw = grad(step, wi), gb = grad(step, wi + 1);
      check(ops->matmul(host->ctx, dz.get(), 1, in.get(), 0, &gw, 1.0f, wgrad_beta));
      check(ops->bias_grad(host->ctx, dz.get(), &gb));
      if (i == 0) {
        check(host->grads_done(step, 0));
        break;
      }
      // dX_i = dZ_i @ W_i, before grads_done: a stage that gathers
      // parameters may release group i once its gradients are final.
      DLTensor w = param(step, wi);
      View dx = buf(scratch[k], n, dims[i]);
      check(ops->matmul(host->ctx, dz.get(), 0, &w, 0, dx.get(), 1.0f, 0.0f));
      check(host->grads_done(step, static_cast<uint32_t>(i)));
      if (act == TSR_ACT_GELU) {
        View z = buf(pre[i - 1], n, dims[i]);
        check(ops->act_backward(host->ctx, act, z.get(), 0, dx.get(), dx.get()));
      } else {
        View a = buf(post[i - 1], n, dims[i]);
        check(ops->act_backward(host->ctx, act, a.get(), 1, dx.get(), dx.get()));
      }
      dz = dx;
      k ^= 1;
    }
  }
};

Mlp *build(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init) {
  if (!host || !host->ops || !host->run) throw Error(TSR_ERR_INVALID, "mlp: incomplete host table");
  if (!init || !init->data) throw Error(TSR_ERR_INVALID, "mlp: no model init or data info");
  const tsr_data_info &data = *init->data;
  sdk::Config c(host, cfg);

  auto m = std::make_unique<Mlp>();
  m->host = host;
  m->ops = host->ops;
  m->device = host->run->device;
  if (host->run->precision == TSR_PRECISION_BF16)
    m->dtype = DLDataType{kDLBfloat, 16, 1};
  else if (host->run->precision == TSR_PRECISION_FP16)
    m->dtype = DLDataType{kDLFloat, 16, 1};
  m->esize = m->dtype.bits / 8;
  m->has_11 = TSR_HAS_FIELD(host->ops, tsr_ops, linear) && host->ops->cast && host->ops->linear;
  if (m->esize != 4 && !m->has_11)
    throw Error(TSR_ERR_UNSUPPORTED,
                "mlp: bf16/fp16 compute needs a host with ABI 1.1 ops (cast, linear)");

  const std::vector<int64_t> hidden = c.get_int_array("hidden");
  for (size_t i = 0; i < hidden.size(); ++i) {
    if (hidden[i] < 1)
      throw Error(TSR_ERR_CONFIG, "mlp: hidden[" + std::to_string(i) +
                                      "] = " + std::to_string(hidden[i]) +
                                      ": every hidden layer needs at least 1 unit");
    // Layer sizes multiply: bounded so that no count of parameters or
    // activations overflows before the host checks the memory.
    if (hidden[i] > kMaxWidth)
      throw Error(TSR_ERR_CONFIG, "mlp: hidden[" + std::to_string(i) +
                                      "] = " + std::to_string(hidden[i]) + " is more than the " +
                                      std::to_string(kMaxWidth) + " units a layer may have");
  }
  const std::string act = c.get_string("activation");
  if (act == "relu")
    m->act = TSR_ACT_RELU;
  else if (act == "gelu")
    m->act = TSR_ACT_GELU;
  else if (act == "tanh")
    m->act = TSR_ACT_TANH;
  else
    throw Error(TSR_ERR_CONFIG, "mlp: activation '" + act + "' is not one of relu|gelu|tanh");
  const std::string init_kind = c.get_string("init");
  if (init_kind != "torch" && init_kind != "normal")
    throw Error(TSR_ERR_CONFIG, "mlp: init '" + init_kind + "' is not one of torch|normal");
  const double init_std = c.get_float("init_std");
  if (!(init_std >= 0) || !std::isfinite(init_std))
    throw Error(TSR_ERR_CONFIG, "mlp: init_std must be a finite number >= 0");

  // What the dataset gives.
  if (!is_dtype(data.input_dtype, kDLFloat, 32))
    throw Error(TSR_ERR_UNSUPPORTED, "mlp: the dataset's inputs are " +
                                         dtype_name(data.input_dtype) +
                                         "; the mlp model takes float32 inputs");
  if (data.target_ndim != 0 || !is_dtype(data.target_dtype, kDLInt, 32))
    throw Error(TSR_ERR_UNSUPPORTED,
                "mlp: the dataset's targets are " + dtype_name(data.target_dtype) + " with " +
                    std::to_string(data.target_ndim) +
                    " dims; the mlp model needs one int32 class label per sample");
  if (data.num_classes < 2)
    throw Error(TSR_ERR_CONFIG, "mlp: the dataset has " + std::to_string(data.num_classes) +
                                    " classes; a classifier needs at least 2");
  if (data.input_ndim < 0 || data.input_ndim > 8)
    throw Error(TSR_ERR_INVALID,
                "mlp: the dataset's input_ndim " + std::to_string(data.input_ndim) + " is invalid");
  int64_t in = 1;
  for (int32_t d = 0; d < data.input_ndim; ++d) {
    if (data.input_shape[d] < 1)
      throw Error(TSR_ERR_INVALID, "mlp: the dataset's input shape has a dim of " +
                                       std::to_string(data.input_shape[d]));
    in *= data.input_shape[d];
  }
  if (init->max_micro_batch < 1)
    throw Error(TSR_ERR_INVALID,
                "mlp: max_micro_batch is " + std::to_string(init->max_micro_batch));
  m->max_batch = init->max_micro_batch;

  m->dims.push_back(in);
  m->dims.insert(m->dims.end(), hidden.begin(), hidden.end());
  m->dims.push_back(data.num_classes);
  const size_t L = m->layers();

  // Parameters, named like nn.Sequential(Linear, act, ...): Linear i is
  // module 2i. Names are complete before infos point into them.
  for (size_t i = 0; i < L; ++i) {
    m->names.push_back(std::to_string(2 * i) + ".weight");
    m->names.push_back(std::to_string(2 * i) + ".bias");
  }
  const bool torch_init = init_kind == "torch";
  for (size_t i = 0; i < L; ++i) {
    const int64_t fan_in = m->dims[i], fan_out = m->dims[i + 1];
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
    tsr_param_info w = sdk::make<tsr_param_info>();
    w.name = m->names[2 * i].c_str();
    w.ndim = 2;
    w.shape[0] = fan_out;
    w.shape[1] = fan_in;
    w.group = static_cast<uint32_t>(i);
    w.trainable = 1;
    w.decay = 1;
    tsr_param_info b = w;
    b.name = m->names[2 * i + 1].c_str();
    b.ndim = 1;
    b.shape[0] = fan_out;
    b.shape[1] = 0;
    b.decay = 0;
    if (torch_init) {  // nn.Linear.reset_parameters: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
      w.init = b.init = TSR_INIT_UNIFORM;
      w.init_a = b.init_a = -bound;
      w.init_b = b.init_b = bound;
    } else {
      w.init = TSR_INIT_NORMAL;
      w.init_a = 0.0f;
      w.init_b = static_cast<float>(init_std);
      b.init = TSR_INIT_ZEROS;
    }
    m->infos.push_back(w);
    m->infos.push_back(b);
    m->weight_elems += static_cast<double>(fan_out) * static_cast<double>(fan_in);
  }

  // Activation buffers for the largest micro-batch.
  const size_t M = static_cast<size_t>(m->max_batch);
  int64_t widest = 0;
  for (size_t i = 0; i + 1 < L; ++i) {
    const size_t bytes = M * static_cast<size_t>(m->dims[i + 1]) * m->esize;
    m->post.emplace_back(host, m->device, bytes, TSR_MEM_ACTIVATIONS);
    if (m->act == TSR_ACT_GELU) m->pre.emplace_back(host, m->device, bytes, TSR_MEM_ACTIVATIONS);
    if (m->dims[i + 1] > widest) widest = m->dims[i + 1];
  }
  m->logits = Buffer(host, m->device, M * static_cast<size_t>(m->classes()) * m->esize,
                     TSR_MEM_ACTIVATIONS);
  if (m->esize != 4)
    m->input = Buffer(host, m->device, M * static_cast<size_t>(m->dims[0]) * m->esize,
                      TSR_MEM_ACTIVATIONS);
  if (widest > 0)
    for (Buffer &s : m->scratch)
      s = Buffer(host, m->device, M * static_cast<size_t>(widest) * m->esize, TSR_MEM_ACTIVATIONS);

  if (host->log) {
    std::string shape;
    for (size_t i = 0; i < m->dims.size(); ++i)
      shape += (i ? " -> " : "") + std::to_string(m->dims[i]);
    int64_t total = 0;
    for (const tsr_param_info &p : m->infos) {
      int64_t numel = 1;
      for (int32_t d = 0; d < p.ndim; ++d) numel *= p.shape[d];
      total += numel;
    }
    const std::string msg =
        "mlp: " + shape + ", " + act_name(m->act) + ", " + std::to_string(total) + " parameters";
    host->log(host->ctx, TSR_LOG_INFO, msg.c_str());
  }
  return m.release();
}

// --- the vtable: the SDK's adapter, with forward and backward under the
// plugin's name so that `break mlp_forward` works in a release build
// (docs/debugging.md; tests/integration/test_debug.cpp) --------------------

using Entries = sdk::ModelEntries<Mlp, build>;

tsr_status mlp_forward(void *self, tsr_step *step, const tsr_batch *batch, int32_t training,
                       tsr_forward_result *out) {
  return Entries::forward(self, step, batch, training, out);
}

tsr_status mlp_backward(void *self, tsr_step *step, const tsr_batch *batch, float loss_scale) {
  return Entries::backward(self, step, batch, loss_scale);
}

constexpr tsr_model_vtable vtable() {
  tsr_model_vtable t = sdk::model_vtable<Mlp, build>();
  t.forward = mlp_forward;
  t.backward = mlp_backward;
  return t;
}

const tsr_param_decl kParams[] = {
    sdk::param_min("hidden", TSR_PARAM_INT_ARRAY, "[256, 128]",
                   "Units of each hidden layer, input side first (each >= 1); [] gives a "
                   "linear softmax classifier",
                   1),
    sdk::param_choice("activation", "\"relu\"",
                      "Activation after every hidden layer (gelu is the tanh approximation)",
                      "relu|gelu|tanh"),
    sdk::param_choice("init", "\"torch\"",
                      "Initialisation: torch = nn.Linear's default, weights and biases uniform "
                      "in +-1/sqrt(fan_in); normal = weights N(0, init_std), biases zero",
                      "torch|normal"),
    sdk::param_min("init_std", TSR_PARAM_FLOAT, "0.02", "Weight std for init = \"normal\"", 0.0),
};

const tsr_model_vtable kVtable = vtable();

const tsr_plugin_descriptor kDescriptor = sdk::describe(
    TSR_KIND_MODEL, "mlp", "1.0.0", kSummary, kParams, TSR_DEVICE_CPU | TSR_DEVICE_CUDA, &kVtable);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kDescriptor)
