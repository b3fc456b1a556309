// residual_mlp: a tessera model plugin, a residual MLP classifier.
//
//   h_0     = act(x W_s^T + b_s)                          stem, [n, width]
//   u_k     = act(h_k W_1k^T + b_1k)                      block k, [n, ffn]
//   h_{k+1} = h_k + u_k W_2k^T + b_2k                     the residual add
//   logits  = h_K W_h^T + b_h                             head, [n, classes]
//   loss    = softmax cross-entropy(logits, targets)
//
// Backward runs the same chain in reverse. The residual makes the gradient
// of h_k the sum of two paths: dh_k = dh_{k+1} + du_k W_1k, where
// du_k = (dh_{k+1} W_2k) * act'(u_k); the second matmul adds into dh in
// place (beta = 1), so one [n, width] buffer carries dh down the blocks.
//
// Every number goes through the host's ops table (matmul, bias_act,
// act_backward, bias_grad, copy, cross_entropy): the plugin never touches
// tensor data, so it runs on whatever device the ops do. One parameter group
// per layer (stem 0, block k is k + 1, head K + 1), so ZeRO can start
// reducing a block's gradients while backward goes on to the next.
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <tessera/cpp/model.hpp>
#include <tessera/cpp/plugin.hpp>
#include <vector>

namespace {

namespace sdk = tessera::sdk;
using sdk::check;
using sdk::Error;

// A contiguous [rows, cols] (or [rows] when cols is 0) view that owns its
// shape; get() re-points the tensor at it, so views may be copied.
struct View {
  int64_t shape[2] = {0, 0};
  DLTensor t;
  View(void *data, uint64_t byte_offset, DLDevice device, DLDataType dtype, int64_t rows,
       int64_t cols) {
    std::memset(&t, 0, sizeof t);
    t.data = data;
    t.byte_offset = byte_offset;
    t.device = device;
    t.dtype = dtype;
    t.ndim = cols ? 2 : 1;
    shape[0] = rows;
    shape[1] = cols;
  }
  DLTensor *get() {
    t.shape = shape;
    return &t;
  }
};

// y = x W^T + b with W [out, in]: the indices of W and b among the declared
// parameters.
struct Linear {
  uint32_t w = 0, b = 0;
  int64_t in = 0, out = 0;
};

struct Block {
  Linear fc1, fc2;  // width -> ffn -> width
  uint32_t group = 0;
};

struct Model {
  static constexpr const char *kName = "residual_mlp";  // for messages
  const tsr_host *host = nullptr;
  const tsr_ops *ops = nullptr;
  DLDevice device{kDLCPU, 0};
  tsr_activation act = TSR_ACT_RELU;
  int64_t inputs = 0, width = 0, ffn = 0, classes = 0, max_batch = 0;

  std::deque<std::string> names;  // stable storage for the names infos point at
  std::vector<tsr_param_info> infos;

  Linear stem, head;
  std::vector<Block> blocks;

  // Activations kept from forward for backward, each for max_batch rows.
  std::vector<sdk::Buffer> h;  // h_0 .. h_K   [n, width]
  std::vector<sdk::Buffer> u;  // u_0 .. u_K-1 [n, ffn]
  sdk::Buffer logits;          // [n, classes]; backward turns it into dlogits
  sdk::Buffer dh, du;          // backward scratch: [n, width], [n, ffn]
  bool ready = false;          // a training forward ran: backward may follow
  int64_t ready_n = 0;

  // 2 FLOPs per weight forward, 4 backward (the stem's dx is not computed, but
  // count it anyway: a rough figure for MFU).
  double flops_per_sample() const {
    double weights = 0;
    for (const tsr_param_info &p : infos)
      if (p.ndim == 2) weights += static_cast<double>(p.shape[0]) * static_cast<double>(p.shape[1]);
    return 6.0 * weights;
  }

  // --- declaring parameters -------------------------------------------------

  // A Linear layer's weight and bias in `group`, initialised like torch's
  // nn.Linear: uniform in +-1/sqrt(in). Weights decay, biases do not.
  Linear linear(const std::string &name, int64_t in, int64_t out, uint32_t group) {
    Linear l;
    l.in = in;
    l.out = out;
    l.w = static_cast<uint32_t>(infos.size());
    l.b = l.w + 1;
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in)));
    tsr_param_info w = sdk::make<tsr_param_info>();
    names.push_back(name + ".weight");
    w.name = names.back().c_str();
    w.ndim = 2;
    w.shape[0] = out;
    w.shape[1] = in;
    w.group = group;
    w.init = TSR_INIT_UNIFORM;
    w.init_a = -bound;
    w.init_b = bound;
    w.trainable = 1;
    w.decay = 1;
    tsr_param_info b = w;
    names.push_back(name + ".bias");
    b.name = names.back().c_str();
    b.ndim = 1;
    b.shape[0] = out;
    b.shape[1] = 0;
    b.decay = 0;
    infos.push_back(w);
    infos.push_back(b);
    return l;
  }

  // --- views ----------------------------------------------------------------

  DLTensor param(tsr_step *step, uint32_t i) const {
    DLTensor t;
    std::memset(&t, 0, sizeof t);
    check(host->param(step, i, &t));
    return t;
  }
  DLTensor grad(tsr_step *step, uint32_t i) const {
    DLTensor t;
    std::memset(&t, 0, sizeof t);
    check(host->grad(step, i, &t));
    return t;
  }
  View buf(const sdk::Buffer &b, int64_t rows, int64_t cols) const {
    return View(b.get(), 0, device, sdk::dtype_f32(), rows, cols);
  }

  // --- layer math -----------------------------------------------------------

  // y = beta * y + x W^T, then y += b and y = act(y).
  void linear_forward(tsr_step *step, const Linear &l, DLTensor *x, DLTensor *y, float beta,
                      tsr_activation a) {
    DLTensor w = param(step, l.w), b = param(step, l.b);
    check(ops->matmul(host->ctx, x, 0, &w, 1, y, 1.0f, beta));
    check(ops->bias_act(host->ctx, y, &b, a));
  }
  // dW += dy^T x, db += colsum(dy); then dx = beta * dx + dy W if dx is given.
  void linear_backward(tsr_step *step, const Linear &l, DLTensor *x, DLTensor *dy, DLTensor *dx,
                       float beta) {
    DLTensor gw = grad(step, l.w), gb = grad(step, l.b);
    check(ops->matmul(host->ctx, dy, 1, x, 0, &gw, 1.0f, 1.0f));
    check(ops->bias_grad(host->ctx, dy, &gb));
    if (dx) {
      DLTensor w = param(step, l.w);
      check(ops->matmul(host->ctx, dy, 0, &w, 0, dx, 1.0f, beta));
    }
  }

  // --- batches --------------------------------------------------------------

  int64_t check_batch(const tsr_batch *batch) const {
    if (!batch) throw Error(TSR_ERR_INVALID, "residual_mlp: batch is NULL");
    if (batch->size < 0 || batch->size > max_batch)
      throw Error(TSR_ERR_INVALID, "residual_mlp: batch of " + std::to_string(batch->size) +
                                       " samples; the model was built for at most " +
                                       std::to_string(max_batch));
    const DLDataType xt = batch->inputs.dtype, yt = batch->targets.dtype;
    if (xt.code != kDLFloat || xt.bits != 32 || yt.code != kDLInt || yt.bits != 32)
      throw Error(TSR_ERR_INVALID,
                  "residual_mlp: batches must hold float32 inputs and int32 "
                  "targets");
    int64_t numel = 1;
    for (int32_t d = 0; d < batch->inputs.ndim; ++d) numel *= batch->inputs.shape[d];
    if (numel != batch->size * inputs)
      throw Error(TSR_ERR_INVALID, "residual_mlp: batch inputs hold " + std::to_string(numel) +
                                       " values, expected " + std::to_string(batch->size) + " x " +
                                       std::to_string(inputs));
    return batch->size;
  }
  View x_of(const tsr_batch *batch, int64_t n) const {
    const DLTensor &t = batch->inputs;
    return View(t.data, t.byte_offset, t.device, t.dtype, n, inputs);
  }
  View y_of(const tsr_batch *batch, int64_t n) const {
    const DLTensor &t = batch->targets;
    return View(t.data, t.byte_offset, t.device, t.dtype, n, 0);
  }

  // --- the passes -----------------------------------------------------------

  void forward(tsr_step *step, const tsr_batch *batch, int32_t training, tsr_forward_result *out) {
    ready = false;
    const int64_t n = check_batch(batch);
    if (!out) throw Error(TSR_ERR_INVALID, "residual_mlp: forward result is NULL");
    double loss_sum = 0;
    int64_t count = 0, correct = 0;
    if (n > 0) {
      View x = x_of(batch, n), y = y_of(batch, n);
      View h0 = buf(h[0], n, width);
      linear_forward(step, stem, x.get(), h0.get(), 0.0f, act);
      for (size_t k = 0; k < blocks.size(); ++k) {
        View hk = buf(h[k], n, width), uk = buf(u[k], n, ffn), hn = buf(h[k + 1], n, width);
        linear_forward(step, blocks[k].fc1, hk.get(), uk.get(), 0.0f, act);
        // h_{k+1} = h_k + (u_k W_2^T + b_2): start from a copy of h_k and let
        // the matmul add into it (beta = 1).
        check(ops->copy(host->ctx, hk.get(), hn.get()));
        linear_forward(step, blocks[k].fc2, uk.get(), hn.get(), 1.0f, TSR_ACT_NONE);
      }
      View hK = buf(h[blocks.size()], n, width), z = buf(logits, n, classes);
      linear_forward(step, head, hK.get(), z.get(), 0.0f, TSR_ACT_NONE);
      check(ops->cross_entropy(host->ctx, z.get(), y.get(), classes, 1.0f, nullptr, &loss_sum,
                               &count, &correct));
    }
    out->loss_sum = loss_sum;
    out->count = count;
    out->correct = correct;
    ready = training != 0;
    ready_n = n;
  }

  void backward(tsr_step *step, const tsr_batch *batch, float loss_scale) {
    const int64_t n = check_batch(batch);
    if (!ready || n != ready_n)
      throw Error(TSR_ERR_INVALID,
                  "residual_mlp: backward needs a training forward over the same batch first");
    ready = false;  // the logits become dlogits: one backward per forward
    const uint32_t K = static_cast<uint32_t>(blocks.size());
    if (n == 0) {  // nothing to add, but every group is final
      for (uint32_t g = K + 2; g-- > 0;) check(host->grads_done(step, g));
      return;
    }
    View x = x_of(batch, n), y = y_of(batch, n);
    View dz = buf(logits, n, classes), g = buf(dh, n, width), gu = buf(du, n, ffn);
    double loss_sum = 0;
    int64_t count = 0;
    // dlogits = loss_scale * (softmax - onehot), written over the logits.
    check(ops->cross_entropy(host->ctx, dz.get(), y.get(), classes, loss_scale, dz.get(), &loss_sum,
                             &count, nullptr));
    // Head: dh = dlogits W_h (the gradient of h_K).
    View hK = buf(h[K], n, width);
    linear_backward(step, head, hK.get(), dz.get(), g.get(), 0.0f);
    check(host->grads_done(step, K + 1));
    // Blocks, last first; on entry dh is the gradient of h_{k+1}.
    for (uint32_t k = K; k-- > 0;) {
      const Block &bk = blocks[k];
      View hk = buf(h[k], n, width), uk = buf(u[k], n, ffn);
      // fc2: its output gradient is dh itself; du = dh W_2, then act'.
      linear_backward(step, bk.fc2, uk.get(), g.get(), gu.get(), 0.0f);
      check(ops->act_backward(host->ctx, act, uk.get(), 1, gu.get(), gu.get()));
      // fc1: dh += du W_1, the second path into h_k.
      linear_backward(step, bk.fc1, hk.get(), gu.get(), g.get(), 1.0f);
      check(host->grads_done(step, bk.group));
    }
    // Stem: dh is the gradient of h_0 = act(z_0); no gradient for the inputs.
    View h0 = buf(h[0], n, width);
    check(ops->act_backward(host->ctx, act, h0.get(), 1, g.get(), g.get()));
    linear_backward(step, stem, x.get(), g.get(), nullptr, 0.0f);
    check(host->grads_done(step, 0));
  }
};

Model *build(const tsr_host *host, const tsr_config *cfg, const tsr_model_init *init) {
  if (!init || !init->data) throw Error(TSR_ERR_INVALID, "residual_mlp: no model init");
  const tsr_data_info &data = *init->data;
  sdk::Config c(host, cfg);
  auto m = std::make_unique<Model>();
  m->host = host;
  m->ops = host->ops;
  m->device = host->run->device;
  m->width = c.get_int("width");
  m->ffn = c.get_int("ffn");
  const int64_t num_blocks = c.get_int("blocks");
  const std::string act = c.get_string("activation");
  m->act = act == "tanh" ? TSR_ACT_TANH : TSR_ACT_RELU;  // both differentiate from the output
  m->max_batch = init->max_micro_batch;

  if (data.input_dtype.code != kDLFloat || data.input_dtype.bits != 32)
    throw Error(TSR_ERR_UNSUPPORTED, "residual_mlp: the dataset's inputs must be float32");
  if (data.target_ndim != 0 || data.target_dtype.code != kDLInt || data.target_dtype.bits != 32)
    throw Error(TSR_ERR_UNSUPPORTED,
                "residual_mlp: the dataset must give one int32 class label per sample");
  if (data.num_classes < 2)
    throw Error(TSR_ERR_CONFIG, "residual_mlp: a classifier needs 2 or more classes");
  m->inputs = 1;
  for (int32_t d = 0; d < data.input_ndim; ++d) m->inputs *= data.input_shape[d];
  m->classes = data.num_classes;

  // Parameters, named like a torch module (stem, blocks.k.fc1, ..., head).
  m->stem = m->linear("stem", m->inputs, m->width, 0);
  for (int64_t k = 0; k < num_blocks; ++k) {
    Block b;
    b.group = static_cast<uint32_t>(k + 1);
    const std::string p = "blocks." + std::to_string(k);
    b.fc1 = m->linear(p + ".fc1", m->width, m->ffn, b.group);
    b.fc2 = m->linear(p + ".fc2", m->ffn, m->width, b.group);
    m->blocks.push_back(b);
  }
  m->head = m->linear("head", m->width, m->classes, static_cast<uint32_t>(num_blocks + 1));

  // Activation memory for the largest micro-batch.
  const size_t rows = static_cast<size_t>(m->max_batch);
  auto alloc = [&](int64_t cols) {
    return sdk::Buffer(host, m->device, rows * static_cast<size_t>(cols) * sizeof(float),
                       TSR_MEM_ACTIVATIONS);
  };
  for (int64_t k = 0; k <= num_blocks; ++k) m->h.push_back(alloc(m->width));
  for (int64_t k = 0; k < num_blocks; ++k) m->u.push_back(alloc(m->ffn));
  m->logits = alloc(m->classes);
  m->dh = alloc(m->width);
  m->du = alloc(m->ffn);

  int64_t total = 0;
  for (const tsr_param_info &p : m->infos)
    total += p.ndim == 2 ? p.shape[0] * p.shape[1] : p.shape[0];
  const std::string msg = "residual_mlp: " + std::to_string(m->inputs) + " -> " +
                          std::to_string(m->width) + " x " + std::to_string(num_blocks) +
                          " residual blocks (ffn " + std::to_string(m->ffn) + ", " + act + ") -> " +
                          std::to_string(m->classes) + ", " + std::to_string(total) + " parameters";
  host->log(host->ctx, TSR_LOG_INFO, msg.c_str());
  return m.release();
}

const tsr_param_decl kParams[] = {
    sdk::param_min("width", TSR_PARAM_INT, "256", "width of the residual stream", 1),
    sdk::param_min("ffn", TSR_PARAM_INT, "512", "hidden units inside each residual block", 1),
    sdk::param_min("blocks", TSR_PARAM_INT, "2", "number of residual blocks", 0),
    sdk::param_choice("activation", "\"relu\"", "activation of the stem and inside the blocks",
                      "relu|tanh"),
};

// The function table: the SDK's adapter over Model, every entry guarded
// (param_info copies at most the host's struct_size).
const tsr_model_vtable kVtable = sdk::model_vtable<Model, build>();

const tsr_plugin_descriptor kDescriptor =
    sdk::describe(TSR_KIND_MODEL, "residual_mlp", "1.0.0",
                  "residual MLP classifier: stem, residual blocks (Linear-act-Linear + skip), head",
                  kParams, TSR_DEVICE_CPU | TSR_DEVICE_CUDA, &kVtable);

}  // namespace

TSR_SDK_PLUGIN_LIBRARY(&kDescriptor)
