// The equivalence matrix of the data-parallel tests, shared by the CPU jobs
// (test_distributed.cpp) and the two-GPU jobs (tests/gpu/jobs): the MLP of
// configs/quickstart.toml (784-256-128-10, relu) on Fashion-MNIST, Adam at a
// constant learning rate (or SGD with momentum), the distributed sampler with
// shuffle and drop_last, a loss line at every step, trained through the real
// launcher (`tessera run -n WORLD`) and compared step by step, and by final
// parameters, with a world-1 stage-0 reference. 6400 training samples (idx
// `limit`) are plenty for 50 steps and keep start-up short.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "harness.hpp"

namespace tessera::itest {

// Where Fashion-MNIST lives: Debian's package path, or TESSERA_FASHION_MNIST
// (a GPU machine that unpacks the package without installing it: tools/gpu-build).
std::string fashion_dir();

// Fails the test (naming the file) when Fashion-MNIST is not installed.
void require_fashion_mnist();

struct Job {
  int world = 1, stage = 0, global = 64, micro = 64;
  int steps = 50;
  bool sgd = false;                                // SGD with momentum instead of Adam
  double clip = 0;                                 // run.gradient_clipping
  std::string device = "cpu", precision = "fp32";  // run.device, run.precision
  std::string offload = "none", ratio = "";        // [offload] plugin and (cpu) ratio
  std::string params = "";                         // [offload] params (stage 3), if set
  std::string offload_more = "";                   // more [offload] lines (name it with `tag`)
  // Another model and data: the [model] and [data.train] sections' TOML
  // replacing the MLP on Fashion-MNIST, and a name for them (llama's jobs).
  std::string model_data = "", tag = "";
  // Final parameters by `tessera ckpt export --format tessera` (every
  // parameter under the model's own names, LoRA adapters too) instead of the
  // model's Hugging Face export where it has one.
  bool own_names = false;
  std::map<std::string, std::string> env = {};  // more environment for the run (name it with `tag`)
  std::vector<std::string> sets = {};           // more --set KEY=VALUE (name it with `tag`)
  int accumulation() const { return global / (micro * world); }
  std::string name() const;
};

// The job's config (TOML text), its run directory at `run_dir`.
std::string fmnist_config(const Job &j, const fs::path &run_dir);

// The final parameters of a run, by the model's tensor names: the
// checkpoint's model.safetensors where it writes one, else the consolidated
// file `tessera ckpt export` makes from the per-rank files.
std::map<std::string, F32Tensor> final_params(const fs::path &run_dir, int step,
                                              bool own_names = false);

struct Trained {
  Job job;
  fs::path dir;
  RunResult run;
  std::vector<int64_t> steps;
  std::vector<double> losses;
  std::map<std::string, F32Tensor> params;
  nlohmann::json summary;
};

// Runs `tessera run -n WORLD` on the job's config and reads what it wrote
// (the final parameters only when `with_params`).
Trained train_job(const Job &j, bool with_params = true);

// Tolerances. Loss: 1e-4 relative at every step (the bar). Final
// parameters: |p - p_ref| <= 1e-4 |p_ref| + 1e-5. The absolute floor is 1% of
// one Adam step at lr 1e-3: weights of pixels that are almost always 0 get
// gradients of ~0 whose rounding (summation order across ranks and
// micro-batches) Adam's normalisation turns into updates of up to ~lr; over 50
// steps these drift by a few 1e-6 even between two world-1 runs that differ
// only in accumulation. A wrong average, a lost or stale slice or a skipped
// update moves parameters by ~1e-3.
struct Tolerance {
  double loss_rel = 1e-4, param_rel = 1e-4, param_abs = 1e-5;
  // > 0: parameters are compared tensor by tensor, |x - ref| / |ref| in the
  // L2 norm against this, instead of element by element (16-bit compute,
  // where single elements wander by a rounding step or two).
  double norm_rel = 0;
};

// Compares `t` with the reference, step by step and parameter by parameter.
void check_equivalent(const Trained &ref, const Trained &t, const Tolerance &tol = {});

// Trains the reference (world 1, stage 0, micro = global, no offload, the
// jobs' optimizer, clipping, device and precision) and then every job of `jobs`,
// each compared with it.
Trained equivalence(int global, const std::vector<Job> &jobs, const Tolerance &tol = {});

// One job per stage 0-3 and micro batch of `micros`, at `world` ranks.
std::vector<Job> every_stage(int world, int global, std::vector<int> micros);

}  // namespace tessera::itest
