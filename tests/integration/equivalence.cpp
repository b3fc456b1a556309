// The equivalence matrix's machinery (equivalence.hpp).
#include "equivalence.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace tessera::itest {

using nlohmann::json;

std::string fashion_dir() {
  const char *env = std::getenv("TESSERA_FASHION_MNIST");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

void require_fashion_mnist() {
  for (const char *f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"})
    if (!fs::exists(fs::path(fashion_dir()) / f))
      FAIL("Fashion-MNIST is not installed: " << (fs::path(fashion_dir()) / f).string()
                                              << " is missing (tools/deps installs it)");
}

std::string Job::name() const {
  // (snprintf: GCC 12's -Wrestrict misfires on a chain of string +.)
  char buf[256];
  std::snprintf(
      buf, sizeof buf, "%s%sw%d_stage%d_g%d_m%dx%d%s%s%s%s%s%s%s", tag.c_str(),
      tag.empty() ? "" : "_", world, stage, global, micro, accumulation(), sgd ? "_sgd" : "",
      clip > 0 ? "_clip" : "", device == "cpu" ? "" : ("_" + device).c_str(),
      precision == "fp32" ? "" : ("_" + precision).c_str(),
      offload == "none" ? "" : ("_" + offload).c_str(), ratio.empty() ? "" : ("_r" + ratio).c_str(),
      params.empty() ? "" : ("_params_" + params).c_str());
  return buf;
}

std::string fmnist_config(const Job &j, const fs::path &run_dir) {
  std::ostringstream s;
  s << "[run]\n"
       "name = \""
    << j.name()
    << "\"\n"
       "device = \""
    << j.device << "\"\nprecision = \"" << j.precision
    << "\"\n"
       "seed = 42\n"
       "steps = "
    << j.steps
    << "\n"
       "log_every = 1\n"
       "gradient_clipping = "
    << j.clip
    << "\n"
       "dir = \""
    << run_dir.string()
    << "\"\n\n"
       "[batch]\n"
       "global = "
    << j.global << "\nmicro = " << j.micro << "\naccumulation = " << j.accumulation() << "\n\n";
  if (!j.model_data.empty()) {
    s << j.model_data << "\n";
  } else {
    s << "[model]\n"
         "plugin = \"mlp\"\n"
         "hidden = [256, 128]\n"
         "activation = \"relu\"\n\n"
         "[data.train]\n"
         "plugin = \"idx\"\n"
         "images = \""
      << (fs::path(fashion_dir()) / "train-images-idx3-ubyte.gz").string() << "\"\nlabels = \""
      << (fs::path(fashion_dir()) / "train-labels-idx1-ubyte.gz").string()
      << "\"\n"
         "limit = 6400\n\n";
  }
  s << "[sampler]\n"
       "plugin = \"distributed\"\n"
       "shuffle = true\n"
       "drop_last = true\n\n"
       "[optimizer]\n"
    << (j.sgd ? "plugin = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n\n"
              : "plugin = \"adam\"\nlr = 1e-3\n\n")
    << "[schedule]\n"
       "type = \"constant\"\n\n"
       "[zero]\n"
       "plugin = \"stage"
    << j.stage << "\"\n";
  if (j.offload != "none" || !j.offload_more.empty()) {
    s << "\n[offload]\nplugin = \"" << j.offload << "\"\n";
    if (!j.ratio.empty()) s << "ratio = \"" << j.ratio << "\"\n";
    // nvme: its state file beside the run, in blocks small enough that the
    // MLP's owned elements span many (the walk's waits then fall between
    // blocks).
    if (j.offload == "nvme")
      s << "path = \"" << (run_dir / "nvme").string() << "\"\nsub_group_size = 4096\n";
    if (!j.params.empty()) s << "params = \"" << j.params << "\"\n";
    s << j.offload_more;
  }
  return s.str();
}

std::map<std::string, F32Tensor> final_params(const fs::path &run_dir, int step, bool own_names) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d", step);
  const fs::path dir = run_dir / "ckpt" / name;
  if (fs::exists(dir / "model.safetensors")) return read_safetensors_f32(dir / "model.safetensors");
  const fs::path out = run_dir.string() + "-export.safetensors";
  std::vector<std::string> args = {"ckpt", "export", dir.string(), "-o", out.string()};
  if (own_names) args.insert(args.end(), {"--format", "tessera"});
  RunResult r = run_cli(args);
  if (r.status != 0) {
    // Not fatal: the test goes on with the other runs; the comparison then
    // fails for want of parameters.
    FAIL_CHECK("tessera ckpt export " << dir.string() << " failed: " << describe(r));
    return {};
  }
  return read_safetensors_f32(out);
}

Trained train_job(const Job &j, bool with_params) {
  Trained t;
  t.job = j;
  t.dir = scratch() / j.name();
  const fs::path config = scratch() / (j.name() + ".toml");
  write_text(config, fmnist_config(j, t.dir));
  RunOptions o;
  o.timeout_s = 300;
  // One OpenBLAS kernel for every run of the matrix, whatever the CPU: the
  // element-wise bars below hold the rounding noise that Adam turns into
  // +-lr steps on near-zero gradients, and that noise depends on the sgemm
  // kernel. On a Zen 3 VM OpenBLAS's own pick (Haswell) put micro-batch-32
  // runs 2.4e-4 off on first-layer pixel weights, losses equal to 1e-4 at
  // every step; with this kernel they sit at 1e-5 (measured 2026-12-01).
  // Set even where the environment has its own: a machine that exports
  // OPENBLAS_CORETYPE=Haswell (an AMD EPYC VM, 2026-12-03) put the
  // stage-2 micro-batch-32 run 24 tolerances off, every other run inside.
  o.env["OPENBLAS_CORETYPE"] = "Sandybridge";
  for (const auto &[k, v] : j.env) o.env[k] = v;
  const double t0 = now_s();
  std::vector<std::string> args = {"run", "-n", std::to_string(j.world), config.string()};
  for (const std::string &kv : j.sets) args.insert(args.end(), {"--set", kv});
  t.run = run_cli(args, o);
  std::printf("  %-28s %5.1f s\n", j.name().c_str(), now_s() - t0);
  std::fflush(stdout);
  INFO(j.name() << ": " << describe(t.run));
  REQUIRE(t.run.status == 0);
  for (const auto &m : read_jsonl(t.dir / "metrics.jsonl"))
    if (m.value("type", "") == "train") {
      t.steps.push_back(m.at("step").get<int64_t>());
      t.losses.push_back(m.at("loss").get<double>());
    }
  if (with_params) t.params = final_params(t.dir, j.steps, j.own_names);
  t.summary = read_json(t.dir / "summary.json");
  return t;
}

void check_equivalent(const Trained &ref, const Trained &t, const Tolerance &tol) {
  INFO(t.job.name() << " against " << ref.job.name());
  // Loss at every step.
  std::vector<int64_t> want_steps;
  for (int64_t s = 1; s <= ref.job.steps; ++s) want_steps.push_back(s);
  REQUIRE(ref.steps == want_steps);
  CHECK(t.steps == want_steps);
  double worst_loss = 0;
  std::string loss_note = "no steps compared";
  for (size_t i = 0; i < std::min(ref.losses.size(), t.losses.size()); ++i) {
    const double rel = std::fabs(t.losses[i] - ref.losses[i]) / std::fabs(ref.losses[i]);
    if (i == 0 || !(rel <= worst_loss)) {  // also catches NaN
      worst_loss = std::isnan(rel) ? INFINITY : rel;
      std::ostringstream n;
      n.precision(9);
      n << "step " << (i + 1) << ": loss " << t.losses[i] << ", reference " << ref.losses[i]
        << " (relative error " << rel << ")";
      loss_note = n.str();
    }
  }
  {
    INFO("largest loss difference at " << loss_note);
    CHECK(worst_loss <= tol.loss_rel);
  }
  // Final parameters, element by element.
  double worst = 0, worst_abs = 0;
  std::string param_note = "no parameters compared";
  REQUIRE(!ref.params.empty());
  if (t.params.empty()) {
    std::printf("  %-28s loss rel err %.2e, no final parameters\n", t.job.name().c_str(),
                worst_loss);
    return;  // final_params() has recorded why
  }
  CHECK(t.params.size() == ref.params.size());
  for (const auto &[name, r] : ref.params) {
    auto it = t.params.find(name);
    if (it == t.params.end()) {
      FAIL_CHECK("the checkpoint has no tensor '" << name << "'");
      continue;
    }
    const F32Tensor &x = it->second;
    if (x.shape != r.shape || x.data.size() != r.data.size()) {
      FAIL_CHECK("tensor '" << name << "' has another shape");
      continue;
    }
    if (tol.norm_rel > 0) {
      // Tensor by tensor: |x - r| / |r| in the L2 norm.
      double diff = 0, norm = 0;
      for (size_t i = 0; i < r.data.size(); ++i) {
        const double a = r.data[i], b = x.data[i];
        diff += (a - b) * (a - b);
        norm += a * a;
        worst_abs = std::max(worst_abs, std::fabs(a - b));
      }
      const double ratio = std::sqrt(diff / std::max(norm, 1e-30)) / tol.norm_rel;
      if (!(ratio <= worst)) {
        worst = std::isnan(ratio) ? INFINITY : ratio;
        std::ostringstream n;
        n << name << ": |x - ref| / |ref| = " << ratio * tol.norm_rel;
        param_note = n.str();
      }
      continue;
    }
    for (size_t i = 0; i < r.data.size(); ++i) {
      const double a = r.data[i], b = x.data[i];
      const double err = std::fabs(a - b);
      const double ratio = err / (tol.param_rel * std::fabs(a) + tol.param_abs);
      worst_abs = std::max(worst_abs, err);
      if (!(ratio <= worst)) {  // also catches NaN
        worst = std::isnan(ratio) ? INFINITY : ratio;
        std::ostringstream n;
        n.precision(9);
        n << name << "[" << i << "] = " << b << ", reference " << a << " (difference " << err
          << ")";
        param_note = n.str();
      }
    }
  }
  std::printf("  %-28s loss rel err %.2e, param err %.2f of tolerance (max abs %.2e)\n",
              t.job.name().c_str(), worst_loss, worst, worst_abs);
  std::fflush(stdout);
  std::ostringstream bar;
  if (tol.norm_rel > 0)
    bar << tol.norm_rel << " (relative L2 norm)";
  else
    bar << tol.param_rel << " |p| + " << tol.param_abs;
  INFO("largest parameter difference: " << param_note << ", " << worst << " of the tolerance "
                                        << bar.str());
  CHECK(worst <= 1.0);
}

Trained equivalence(int global, const std::vector<Job> &jobs, const Tolerance &tol) {
  REQUIRE(!jobs.empty());
  if (jobs.front().model_data.empty()) require_fashion_mnist();
  Job r = jobs.front();
  r.world = 1;
  r.stage = 0;
  r.global = r.micro = global;
  r.offload = "none";  // the reference keeps its state where compute runs
  r.ratio.clear();
  r.params.clear();
  const Trained ref = train_job(r);
  for (const Job &j : jobs) {
    REQUIRE(j.global == global);
    REQUIRE(
        (j.sgd == r.sgd && j.clip == r.clip && j.device == r.device && j.precision == r.precision));
    REQUIRE(j.micro * j.accumulation() * j.world == global);
    check_equivalent(ref, train_job(j), tol);
  }
  return ref;
}

std::vector<Job> every_stage(int world, int global, std::vector<int> micros) {
  std::vector<Job> v;
  for (int stage = 0; stage <= 3; ++stage)
    for (int m : micros) {
      Job j;
      j.world = world;
      j.stage = stage;
      j.global = global;
      j.micro = m;
      v.push_back(j);
    }
  return v;
}

}  // namespace tessera::itest
