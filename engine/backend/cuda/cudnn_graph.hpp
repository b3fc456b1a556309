// A small builder over cuDNN's backend API: tensors and the four operation
// kinds the fused attention graphs are made of (pointwise, reduction,
// matmul, reshape), the operation graph, an execution plan from cuDNN's
// heuristics, and execution through a variant pack.
//
// cuDNN recognises a fused pattern (flash attention) in a graph of these
// primitive operations and runs it as one kernel; attention_cudnn.cpp writes
// the graphs. Everything here throws tessera::Error(TSR_ERR_UNSUPPORTED) with
// cuDNN's message when a call fails, so a caller can decline and fall back.
// Only compiled with TESSERA_HAVE_CUDNN.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cudnn_lib.hpp"

namespace tessera::cuda::cudnn {

using Dims4 = std::array<int64_t, 4>;

class Graph {
 public:
  explicit Graph(const Lib &l) : l_(l) {}

  // A tensor the variant pack binds to memory: uid > 0 and below kFirstVirtual.
  int64_t tensor(int64_t uid, cudnnDataType_t dt, Dims4 dims, Dims4 strides);
  // A scalar passed by value at execution (a host pointer in the variant
  // pack), shaped [1,1,1,1] to broadcast against 4-D operands.
  int64_t scalar(int64_t uid, cudnnDataType_t dt);
  // An intermediate that never reaches memory; uids from kFirstVirtual on.
  int64_t virt(cudnnDataType_t dt, Dims4 dims, Dims4 strides);
  // A virtual output shaped like tensor `like`.
  int64_t virt_like(int64_t like, cudnnDataType_t dt) {
    return virt(dt, info(like).dims, info(like).strides);
  }

  // y = mode(x[, b[, t]]) with math in `math`; b and t are 0 when unused.
  // `axis` is GEN_INDEX's axis (-1 otherwise).
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, int64_t x, int64_t b, int64_t t,
                 int64_t y, int64_t axis = -1);
  // y = reduce(x) over the dims where y has extent 1, fp32 math.
  void reduction(cudnnReduceTensorOp_t op, int64_t x, int64_t y);
  // c = a @ b over the last two dims, batched over the first two; fp32 math.
  void matmul(int64_t a, int64_t b, int64_t c);
  // y = x seen through y's dims and strides (no data movement).
  void reshape(int64_t x, int64_t y);

  // Finalizes the operation graph. `handle` may be NULL when device
  // properties stand in for the device (deviceless plan building).
  void finalize(cudnnHandle_t handle);
  const Desc &op_graph() const { return *op_graph_; }

  static constexpr int64_t kFirstVirtual = 1000;

 private:
  struct Info {
    Desc desc;
    Dims4 dims, strides;
    cudnnDataType_t dt;
  };
  const Info &info(int64_t uid) const;
  int64_t add(int64_t uid, cudnnDataType_t dt, Dims4 dims, Dims4 strides, bool is_virtual,
              bool by_value);
  void add_op(Desc &&op) { ops_.push_back(std::move(op)); }

  const Lib &l_;
  std::map<int64_t, Info> tensors_;
  std::vector<Desc> descs_;  // operation-level descriptors (pointwise, matmul, ...)
  std::vector<Desc> ops_;    // the operations, in order
  std::unique_ptr<Desc> op_graph_;
  int64_t next_virtual_ = kFirstVirtual;
};

// An execution plan and what running it needs.
struct Plan {
  std::unique_ptr<Graph> graph;  // kept alive with the plan
  std::unique_ptr<Desc> plan;
  int64_t workspace = 0;  // bytes of device memory cuDNN wants at execution
  int64_t engine = -1;    // cuDNN's global engine index, for messages
};

// Builds the plan for a finalized graph from the heuristics' engine configs
// (mode A, then the fallback list), taking the first that finalizes, and
// trying at most `max_configs`. `handle` NULL and `devprop` set:
// deviceless, for the properties given.
Plan build_plan(const Lib &l, std::unique_ptr<Graph> graph, cudnnHandle_t handle,
                const Desc *devprop, int max_configs = 1 << 30);

// The global indices of the engines whose configs pass cuDNN's support
// checks for a finalized graph (heuristics mode A), best first: empty when
// no engine recognises the graph. Needs no GPU with `devprop`, which is
// what makes it a check of the graphs on a build machine.
std::vector<int64_t> supported_engines(const Lib &l, const Graph &g, const Desc *devprop);

// Runs `plan` on `handle`'s stream with uids[i] bound to ptrs[i] and the
// workspace (at least plan.workspace bytes; NULL when that is 0).
void execute(const Lib &l, cudnnHandle_t handle, const Plan &plan, const std::vector<int64_t> &uids,
             const std::vector<void *> &ptrs, void *workspace);

// Device properties of an H200 (sm_90, 132 multiprocessors), for deviceless
// plan building on a machine without the GPU (cuDNN 9.8 and newer): a check
// that cuDNN accepts a graph, not a substitute for running it.
Desc h200_properties(const Lib &l);

}  // namespace tessera::cuda::cudnn
