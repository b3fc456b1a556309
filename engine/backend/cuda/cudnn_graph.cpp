// The backend-API builder of cudnn_graph.hpp: each function below is the
// attribute sequence cuDNN's documentation gives for its descriptor type.
#if TESSERA_HAVE_CUDNN

#include "backend/cuda/cudnn_graph.hpp"

#include "util/error.hpp"

namespace tessera::cuda::cudnn {

namespace {

// cuDNN's flash-attention engines want 16-byte aligned operands; the
// callers check the pointers before they bind them.
constexpr int64_t kAlignment = 16;

}  // namespace

const Graph::Info &Graph::info(int64_t uid) const {
  auto it = tensors_.find(uid);
  TSR_CHECK(it != tensors_.end(), TSR_ERR_INTERNAL,
            "cudnn graph: unknown tensor " + std::to_string(uid));
  return it->second;
}

int64_t Graph::add(int64_t uid, cudnnDataType_t dt, Dims4 dims, Dims4 strides, bool is_virtual,
                   bool by_value) {
  TSR_CHECK(!tensors_.count(uid), TSR_ERR_INTERNAL,
            "cudnn graph: uid " + std::to_string(uid) + " twice");
  Desc d(l_, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "cudnn tensor");
  d.set1(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, dt);
  d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  d.set1(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid);
  d.set1(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, kAlignment);
  if (is_virtual) d.set1(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, true);
  if (by_value) d.set1(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, true);
  d.finalize();
  tensors_.emplace(uid, Info{std::move(d), dims, strides, dt});
  return uid;
}

int64_t Graph::tensor(int64_t uid, cudnnDataType_t dt, Dims4 dims, Dims4 strides) {
  TSR_CHECK(uid > 0 && uid < kFirstVirtual, TSR_ERR_INTERNAL, "cudnn graph: bad uid");
  return add(uid, dt, dims, strides, false, false);
}

int64_t Graph::scalar(int64_t uid, cudnnDataType_t dt) {
  TSR_CHECK(uid > 0 && uid < kFirstVirtual, TSR_ERR_INTERNAL, "cudnn graph: bad uid");
  return add(uid, dt, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
}

int64_t Graph::virt(cudnnDataType_t dt, Dims4 dims, Dims4 strides) {
  return add(next_virtual_++, dt, dims, strides, true, false);
}

void Graph::pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, int64_t x, int64_t b,
                      int64_t t, int64_t y, int64_t axis) {
  Desc pw(l_, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "cudnn pointwise");
  pw.set1(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode);
  pw.set1(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, math);
  if (mode == CUDNN_POINTWISE_GEN_INDEX) pw.set1(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, axis);
  pw.finalize();
  Desc op(l_, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "cudnn pointwise op");
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, info(x).desc);
  if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, info(b).desc);
  if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, info(t).desc);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, info(y).desc);
  const float one = 1.0f;
  op.set1(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, one);
  op.set1(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, one);
  op.finalize();
  descs_.push_back(std::move(pw));
  add_op(std::move(op));
}

void Graph::reduction(cudnnReduceTensorOp_t red, int64_t x, int64_t y) {
  Desc r(l_, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "cudnn reduction");
  r.set1(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
  r.set1(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, red);
  r.finalize();
  Desc op(l_, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "cudnn reduction op");
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, info(x).desc);
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, info(y).desc);
  op.finalize();
  descs_.push_back(std::move(r));
  add_op(std::move(op));
}

void Graph::matmul(int64_t a, int64_t b, int64_t c) {
  Desc m(l_, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "cudnn matmul");
  m.set1(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
  m.finalize();
  Desc op(l_, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "cudnn matmul op");
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, info(a).desc);
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, info(b).desc);
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, info(c).desc);
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
  op.finalize();
  descs_.push_back(std::move(m));
  add_op(std::move(op));
}

void Graph::reshape(int64_t x, int64_t y) {
  Desc op(l_, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "cudnn reshape op");
  op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, info(x).desc);
  op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, info(y).desc);
  op.finalize();
  add_op(std::move(op));
}

void Graph::finalize(cudnnHandle_t handle) {
  op_graph_ = std::make_unique<Desc>(l_, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "cudnn op graph");
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Desc &d : ops_) ops.push_back(d.get());
  op_graph_->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                 static_cast<int64_t>(ops.size()), ops.data());
  if (handle) op_graph_->set1(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle);
  op_graph_->finalize();
}

namespace {

// The engine configs of one heuristics mode, best first.
std::vector<Desc> engine_configs(const Lib &l, const Graph &g, cudnnBackendHeurMode_t mode,
                                 const Desc *devprop) {
  Desc heur(l, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "cudnn heuristics");
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g.op_graph());
  heur.set1(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, mode);
  if (devprop) heur.set_desc(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *devprop);
  heur.finalize();
  int64_t count = 0;
  check(l,
        l.get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                   &count, nullptr),
        "cudnn heuristics: result count");
  std::vector<Desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; i++) {
    cfgs.emplace_back(l, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "cudnn engine config");
    raw.push_back(cfgs.back().get());
  }
  int64_t got = 0;
  if (count > 0)
    check(l,
          l.get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                     count, &got, raw.data()),
          "cudnn heuristics: results");
  while (static_cast<int64_t>(cfgs.size()) > got) cfgs.pop_back();
  return cfgs;
}

int64_t engine_index(const Lib &l, const Desc &cfg) {
  try {
    Desc engine(l, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "cudnn engine");
    cudnnBackendDescriptor_t e = engine.get();
    int64_t n = 0, id = -1;
    if (l.get_attr(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                   &e) != CUDNN_STATUS_SUCCESS)
      return -1;
    if (l.get_attr(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &id) !=
        CUDNN_STATUS_SUCCESS)
      return -1;
    return id;
  } catch (const Error &) {
    return -1;  // only for messages
  }
}

}  // namespace

std::vector<int64_t> supported_engines(const Lib &l, const Graph &g, const Desc *devprop) {
  std::vector<int64_t> ids;
  for (const Desc &cfg : engine_configs(l, g, CUDNN_HEUR_MODE_A, devprop))
    ids.push_back(engine_index(l, cfg));
  return ids;
}

Plan build_plan(const Lib &l, std::unique_ptr<Graph> graph, cudnnHandle_t handle,
                const Desc *devprop, int max_configs) {
  std::string errors;
  int tried = 0;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<Desc> cfgs;
    try {
      cfgs = engine_configs(l, *graph, mode, devprop);
    } catch (const Error &e) {
      if (errors.size() < 600) errors += std::string(errors.empty() ? "" : "; ") + e.what();
      continue;
    }
    for (const Desc &cfg : cfgs) {
      if (tried >= max_configs) break;
      tried++;
      try {
        auto plan = std::make_unique<Desc>(l, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                           "cudnn execution plan");
        if (handle) plan->set1(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, handle);
        plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
        plan->finalize();
        Plan p;
        int64_t n = 0;
        check(l,
              l.get_attr(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                         &n, &p.workspace),
              "cudnn execution plan: workspace size");
        p.engine = engine_index(l, cfg);
        p.plan = std::move(plan);
        p.graph = std::move(graph);
        return p;
      } catch (const Error &e) {
        if (errors.size() < 600) errors += std::string(errors.empty() ? "" : "; ") + e.what();
      }
    }
  }
  // cuDNN gives its reasons for refusing configs only in its log.
  throw Error(TSR_ERR_UNSUPPORTED,
              "no cuDNN engine takes the graph (" + std::to_string(tried) + " configs tried" +
                  (errors.empty() ? "" : ": " + errors) +
                  "; CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr shows cuDNN's reasons)");
}

void execute(const Lib &l, cudnnHandle_t handle, const Plan &plan, const std::vector<int64_t> &uids,
             const std::vector<void *> &ptrs, void *workspace) {
  TSR_CHECK(uids.size() == ptrs.size(), TSR_ERR_INTERNAL,
            "cudnn execute: uids and pointers differ");
  Desc pack(l, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "cudnn variant pack");
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(ptrs.size()), ptrs.data());
  pack.set1(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace);
  pack.finalize();
  check(l, l.execute(handle, plan.plan->get(), pack.get()), "cudnnBackendExecute");
}

Desc h200_properties(const Lib &l) {
  // The fields cuDNN 9.19's device-property JSON asks for, with an H200's
  // values (cudaGetDeviceProperties on the GPU); cuDNN uses them to pick and
  // compile kernels for sm_90.
  static const char kJson[] =
      R"({"deviceName":"NVIDIA H200","cudaDeviceId":0,"deviceVer":900,"multiProcessorCount":132,)"
      R"("driverVer":13000,"maxSharedMemoryPerBlockOptin":232448,"totalGlobalMem":150754820096,)"
      R"("maxGridSize":[2147483647,65535,65535],"maxBlockSize":[1024,1024,64],)"
      R"("maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"maxRegistersPerSM":65536,)"
      R"("maxSharedMemoryPerBlock":49152,"maxCtasPerSM":32,"memClockRateKHz":3201000,)"
      R"("isTccDriver":0,"pciDeviceId":0,"regsPerBlock":65536,"reservedSharedMemoryPerBlock":1024,)"
      R"("smClockRateKHz":1980000,"supportCoopLaunch":1,"warpSize":32,"l2CacheSize":62914560,)"
      R"("maxSharedMemoryPerSM":233472,"pciBusId":0,"pciDomainId":0,"upper_bandwidth":0})";
  TSR_CHECK(l.version >= 90800, TSR_ERR_UNSUPPORTED,
            "deviceless plans need cuDNN 9.8 or newer, this is " + version_string(l.version));
  Desc d(l, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "cudnn device properties");
  d.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
        static_cast<int64_t>(sizeof kJson - 1), kJson);
  d.finalize();
  return d;
}

}  // namespace tessera::cuda::cudnn

#endif  // TESSERA_HAVE_CUDNN
