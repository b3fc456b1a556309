// tessera plugin check CONFIG: the gradient check and the ABI conventions of
// the config's model plugin, on a few samples of its training data
// (engine/check/gradcheck.hpp says what is checked).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "check/gradcheck.hpp"
#include "cli/args.hpp"
#include "data/loader.hpp"
#include "train/job.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"

namespace tessera::cli {

namespace {

const char *kCheckUsage = R"(usage: tessera plugin check CONFIG [options]

Checks the model plugin of CONFIG on a few samples of its [data.train]:

  gradients     for every trainable parameter tensor, the gradient backward
                computes against central finite differences of forward's
                loss (fp32, a step per tensor); a line per tensor with the
                relative error, fp32's noise at that step and the worst
                element. A tensor passes when its error is within the
                tolerance plus that noise (the loss's measured rounding
                over the step), so a correct backward passes at small
                initial scales too; a note says which tensors' gradients
                are too close to the noise to check closely
  struct sizes  param_info and forward keep the host's struct_size and write
                nothing past it
  groups        every declared group is read by forward
  grads_done    backward declares every trainable group's gradients final
                exactly once, and takes no gradient after that
  forward       the same batch and parameters give the same loss

It exits 0 when everything passes, else 1, naming the failing tensor nearest
the bug (a wrong gradient flows on to every tensor backward computes after
it: the one whose error jumps most over the tensor backward computed just
before it), or the failing check. The run is on the CPU in fp32 with ZeRO stage 0 on one rank, whatever
CONFIG says ([zero], [offload] and [batch] are replaced).

  --batch N         samples in the batch (default 4)
  --elements N      elements checked per tensor: half the largest gradients,
                    half at random (default 24; 0: every element)
  --tolerance X     the largest relative error that passes (default 0.01)
  --set KEY=VALUE   override a config key (repeatable), e.g. to turn dropout off
  --unset KEY       remove a key or a whole section (repeatable)
  --deepspeed_config FILE, --plugin-path DIR   as for 'tessera run'
  -h, --help        this help

docs/writing-a-model.md starts with it.
)";

int64_t number_option(const Parsed &p, const std::string &name, int64_t fallback) {
  const std::string v = p.get(name);
  if (v.empty()) return fallback;
  char *end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0' || x < 0) throw UsageError(name + " '" + v + "' is not a non-negative integer");
  return x;
}

// The user's config, run on one rank on the CPU in fp32 under stage 0 with
// a batch of `batch`: the check reads and perturbs host memory directly.
JobOptions check_options(const Parsed &p, int64_t batch) {
  if (p.positional.size() != 2)
    throw UsageError("tessera plugin check: expected exactly one CONFIG file");
  JobOptions o;
  o.config_path = p.positional[1];
  o.deepspeed_path = p.get("--deepspeed_config", p.get("--deepspeed", ""));
  o.sets = p.all("--set");
  o.unsets = p.all("--unset");
  o.plugin_paths = p.all("--plugin-path");
  const config::Document doc = load_document(o);
  for (const char *section : {"zero", "offload", "batch"})
    if (config::find(doc.root(), section)) o.unsets.push_back(section);
  for (const std::string &s :
       {std::string("zero.plugin=stage0"), std::string("offload.plugin=none"),
        std::string("run.device=cpu"), std::string("run.precision=fp32"),
        "batch.micro=" + std::to_string(batch)})
    o.sets.push_back(s);
  // The check never steps an optimizer, but a training session builds one.
  if (!config::find(doc.root(), "optimizer")) o.sets.push_back("optimizer.plugin=sgd");
  return o;
}

void print_tensor(const TensorCheck &t, size_t name_width) {
  std::string shape = "[";
  for (size_t d = 0; d < t.shape.size(); ++d) shape += (d ? ", " : "") + std::to_string(t.shape[d]);
  shape += "]";
  if (!t.trainable) {
    std::printf("  skip  %-*s %-14s frozen (trainable = 0)\n", static_cast<int>(name_width),
                t.name.c_str(), shape.c_str());
    return;
  }
  std::string worst = "[";
  for (size_t d = 0; d < t.worst_index.size(); ++d)
    worst += (d ? ", " : "") + std::to_string(t.worst_index[d]);
  worst += "]";
  std::printf(
      "  %-4s  %-*s %-14s %zu of %zu elements, step %.0e: relative error %.2e (fp32 noise "
      "%.1e%s); worst %s: analytic %.6e, numeric %.6e\n",
      t.ok ? "ok" : "FAIL", static_cast<int>(name_width), t.name.c_str(), shape.c_str(), t.checked,
      t.numel, t.step, t.rel_error, t.floor, t.near_noise ? ", gradients near it" : "",
      worst.c_str(), t.worst_analytic, t.worst_numeric);
  std::fflush(stdout);
}

// Tensors whose gradients are within 10x of fp32's finite-difference noise
// pass or fail on the noise rather than on backward: say so, and how to
// make the gradients larger.
void print_noise_note(const GradCheckReport &rep) {
  std::string names;
  size_t n = 0;
  for (const auto &t : rep.tensors)
    if (t.trainable && t.near_noise && n++ < 4) names += (names.empty() ? "" : ", ") + t.name;
  if (n == 0) return;
  std::printf(
      "note: the gradients of %zu tensor%s (%s%s) are within 10x of what fp32 finite "
      "differences resolve (the loss moves by %.1e from rounding alone), so an error smaller "
      "than that goes unseen there. To check them closely, raise the model's initial scale "
      "(its init std, e.g. 0.1 to 0.5, with --set).\n",
      n, n == 1 ? "" : "s", names.c_str(), n > 4 ? ", ..." : "", rep.loss_noise);
}

int check_body(const Parsed &p) {
  const int64_t batch_size = std::max<int64_t>(1, number_option(p, "--batch", 4));
  GradCheckOptions opt;
  opt.max_elements = number_option(p, "--elements", 24);
  if (p.has("--tolerance")) {
    char *end = nullptr;
    opt.tolerance = std::strtod(p.get("--tolerance").c_str(), &end);
    if (*end != '\0' || !(opt.tolerance > 0))
      throw UsageError("--tolerance '" + p.get("--tolerance") + "' is not a positive number");
  }
  Job job = load_job(check_options(p, batch_size), 1, true);
  for (const auto &w : job.doc.warnings()) spdlog::warn("{}", w);
  ProcessInfo proc;
  prepare_process(job, proc);
  Session s(job, run_facts(job, proc), true);
  const int64_t n = std::min<int64_t>(batch_size, s.train_info.length);
  std::vector<int64_t> indices(static_cast<size_t>(n));
  std::iota(indices.begin(), indices.end(), int64_t{0});
  Loader loader(s.host, s.train_data.vt, s.train_data.self, s.train_info, indices, n, true, 0, 1,
                "data.train");
  const tsr_batch *batch = loader.next();
  if (!batch) throw Error(TSR_ERR_INVALID, "[data.train] gave no batch to check with");

  const PluginChoice &model = job.plugin("model");
  std::printf("tessera plugin check: model '%s' (%s), %lld samples of [data.train] '%s'\n",
              s.model.name.c_str(), model.entry->file.c_str(), static_cast<long long>(n),
              s.train_data.name.c_str());
  size_t width = 0;
  for (const auto &q : s.layout.params) width = std::max(width, q.name.size());
  std::printf(
      "gradients (central differences in fp32 against backward; relative error = "
      "|numeric - analytic| / max(|numeric|, |analytic|) over the elements checked):\n");
  std::fflush(stdout);
  GradCheckReport rep =
      check_model(s, *batch, opt, [&](const TensorCheck &t) { print_tensor(t, width); });
  print_noise_note(rep);
  std::printf("conventions:\n");
  for (const auto &c : rep.conventions)
    std::printf("  %-4s  %-12s %s\n", c.ok ? "ok" : "FAIL", c.what.c_str(), c.detail.c_str());
  if (rep.ok()) {
    std::printf("passed: %zu parameter tensors, mean loss %.6f on the batch\n", rep.tensors.size(),
                rep.loss);
    return 0;
  }
  std::fflush(stdout);  // the verdict comes after the lines it sums up
  std::fprintf(stderr, "tessera plugin check: failed: %s\n",
               rep.first_failure(opt.tolerance).c_str());
  return 1;
}

}  // namespace

int cmd_plugin_check(const Args &args) {
  auto specs = config_options();
  for (const char *o : {"--batch", "--elements", "--tolerance"}) specs.push_back({o, true, false});
  return run_command("plugin check", kCheckUsage, check_body, args, specs);
}

}  // namespace tessera::cli
