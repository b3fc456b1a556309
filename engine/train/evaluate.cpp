// Evaluation: a forward pass over the eval data, every rank a share.
#include <algorithm>

#include "data/loader.hpp"
#include "train/model_file.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"

namespace tessera {

EvalResult evaluate(Session &s, int64_t batch_size) {
  bool use_eval = s.has_eval();
  auto &inst = use_eval ? s.eval_data : s.train_data;
  const tsr_data_info &info = use_eval ? s.eval_info : s.train_info;
  // Contiguous, balanced shares per rank; no padding so nothing counts twice.
  const auto &f = s.host.facts();
  int64_t n = info.length, w = f.world_size, r = f.rank;
  int64_t base = n / w, extra = n % w;
  int64_t begin = r * base + std::min(r, extra), count = base + (r < extra ? 1 : 0);
  std::vector<int64_t> idx(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) idx[static_cast<size_t>(i)] = begin + i;
  Loader loader(s.host, inst.vt, inst.self, info, std::move(idx), batch_size, true,
                static_cast<int>(s.job.settings.workers), static_cast<int>(s.job.settings.prefetch),
                use_eval ? "data.eval" : "data.train");
  ModelPass pass(s, forward_phase());
  tsr_step *step = pass.handle();
  // loss sum, counted, correct, and whether every batch classified.
  double acc[4] = {0, 0, 0, 1};
  while (const tsr_batch *b = loader.next()) {
    tsr_forward_result res{};
    res.struct_size = tsr_forward_result_STRUCT_SIZE;
    plugin_ok(s.host, s.model.vt->forward(s.model.self, step, b, 0, &res), "model", s.model.name,
              "forward (eval)");
    plugin_ok(s.host, s.zero.vt->end_pass(s.zero.self), "zero", s.zero.name, "end_pass");
    acc[0] += res.loss_sum;
    acc[1] += static_cast<double>(res.count);
    acc[2] += static_cast<double>(std::max<int64_t>(res.correct, 0));
    if (res.correct < 0) acc[3] = 0;
  }
  if (w > 1) {
    // Sum over ranks (the "classifies" flag as a minimum).
    int64_t three = 3, one = 1;
    DLTensor sums{acc, DLDevice{kDLCPU, 0}, 1, DLDataType{kDLFloat, 64, 1}, &three, nullptr, 0};
    DLTensor flag{acc + 3, DLDevice{kDLCPU, 0}, 1, DLDataType{kDLFloat, 64, 1}, &one, nullptr, 0};
    plugin_ok(s.host,
              s.host.table()->comm->all_reduce(s.host.ctx(), &sums, TSR_REDUCE_SUM, nullptr),
              "eval all-reduce");
    plugin_ok(s.host,
              s.host.table()->comm->all_reduce(s.host.ctx(), &flag, TSR_REDUCE_MIN, nullptr),
              "eval all-reduce");
  }
  EvalResult out;
  out.count = static_cast<int64_t>(acc[1]);
  out.loss = acc[1] > 0 ? acc[0] / acc[1] : 0.0;
  out.accuracy = acc[3] > 0 && acc[1] > 0 ? acc[2] / acc[1] : -1;
  return out;
}

nlohmann::json evaluate_checkpoint(const Job &job, const ProcessInfo &proc,
                                   const std::string &ckpt) {
  prepare_process(job, proc);
  std::string file;
  // No checkpoint: the model's own initial weights (its init_from file).
  ParamInitializer load;
  if (!ckpt.empty())
    load = [&](const Layout &layout, float *flat) { file = load_model_params(ckpt, layout, flat); };
  Session s(job, run_facts(job, proc), false, load);
  EvalResult r = evaluate(s, job.settings.micro_batch);
  MemoryStats mem = s.host.memory();
  return {{"checkpoint", file},
          {"eval_loss", r.loss},
          {"eval_accuracy", r.accuracy >= 0 ? nlohmann::json(r.accuracy) : nlohmann::json(nullptr)},
          {"samples", r.count},
          {"optimizer_state_bytes", mem.peak[TSR_MEM_OPTIMIZER]},
          {"gradient_bytes", mem.peak[TSR_MEM_GRADS]},
          {"peak_memory_bytes", mem.peak_total}};
}

}  // namespace tessera
