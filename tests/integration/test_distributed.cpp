// Multi-process jobs through the real launcher (`tessera run -n N`) on the
// CPU: what issue 3 ("Data-parallel training across processes") must show.
//
//   equivalence  every ZeRO stage at world sizes 1..4 trains the MLP on
//                Fashion-MNIST exactly as the world-1 stage-0 run does (loss at
//                every step, final parameters)
//   memory       per-rank bytes at world size 4 follow DESIGN.md's table
//   faults       a SIGKILLed worker, a rank failing inside the job, and a rank
//                crashing all stop the job promptly, naming the rank
//   launcher     rank prefixes, rank 0 alone reports progress, SIGTERM, and
//                workers started by another launcher (torchrun variables)
//
// Samplers across ranks (the union of an epoch's indices covers the dataset,
// overlapping only where DistributedSampler pads) are not checked here: the
// engine does not expose each rank's indices, so tests/unit/test_samplers.cpp
// checks the distributed sampler directly. The equivalence runs check it
// indirectly: a rank that saw other samples would change every step's loss.
//
// A rank that hangs (never reaches a collective) is out of scope: only
// comm.timeout_s ends that, and a test of it would take that long.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <regex>
#include <sstream>
#include <thread>

#include "harness.hpp"

using namespace tessera::itest;
using nlohmann::json;

namespace {

const fs::path kFashion = "/usr/share/datasets/fashion-mnist";

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

bool starts_with(const std::string &s, const std::string &prefix) {
  return s.rfind(prefix, 0) == 0;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The launcher's own verdict: its last "tessera run: failed: " line.
std::string launcher_verdict(const std::string &err) {
  std::string found;
  for (const auto &line : lines(err))
    if (starts_with(line, "tessera run: failed: ")) found = line;
  return found;
}

// Lines of `text` that worker `rank` printed (the launcher's prefix).
std::vector<std::string> rank_lines(const std::string &text, int rank) {
  std::vector<std::string> v;
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  for (const auto &line : lines(text))
    if (starts_with(line, prefix)) v.push_back(line);
  return v;
}

bool any_line_has(const std::vector<std::string> &ls, const std::vector<std::string> &parts) {
  for (const auto &l : ls) {
    bool all = true;
    for (const auto &p : parts) all = all && contains(l, p);
    if (all) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// The equivalence matrix: the MLP of configs/quickstart.toml on Fashion-MNIST.

void require_fashion_mnist() {
  for (const char *f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"})
    if (!fs::exists(kFashion / f))
      FAIL("Fashion-MNIST is not installed: " << (kFashion / f).string()
                                              << " is missing (tools/deps installs it)");
}

struct Job {
  int world = 1, stage = 0, global = 64, micro = 64;
  int steps = 50;
  bool sgd = false;  // SGD with momentum instead of Adam
  double clip = 0;   // run.gradient_clipping
  int accumulation() const { return global / (micro * world); }
  std::string name() const {
    // (snprintf: GCC 12's -Wrestrict misfires on a chain of string +.)
    char buf[96];
    std::snprintf(buf, sizeof buf, "w%d_stage%d_g%d_m%dx%d%s%s", world, stage, global, micro,
                  accumulation(), sgd ? "_sgd" : "", clip > 0 ? "_clip" : "");
    return buf;
  }
};

// 784-256-128-10 relu MLP (as configs/quickstart.toml), Adam at a constant
// learning rate, fp32 on the CPU, the distributed sampler with shuffle and
// drop_last, a loss line at every step. 6400 training samples (idx `limit`)
// are plenty for 50 steps and keep start-up short.
std::string fmnist_config(const Job &j, const fs::path &run_dir) {
  std::ostringstream s;
  s << "[run]\n"
       "name = \""
    << j.name()
    << "\"\n"
       "device = \"cpu\"\n"
       "precision = \"fp32\"\n"
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
    << j.global << "\nmicro = " << j.micro << "\naccumulation = " << j.accumulation()
    << "\n\n"
       "[model]\n"
       "plugin = \"mlp\"\n"
       "hidden = [256, 128]\n"
       "activation = \"relu\"\n\n"
       "[data.train]\n"
       "plugin = \"idx\"\n"
       "images = \""
    << (kFashion / "train-images-idx3-ubyte.gz").string() << "\"\nlabels = \""
    << (kFashion / "train-labels-idx1-ubyte.gz").string()
    << "\"\n"
       "limit = 6400\n\n"
       "[sampler]\n"
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
  return s.str();
}

// The final parameters of a run, by the model's tensor names: the
// checkpoint's model.safetensors where it writes one, else the consolidated
// file `tessera ckpt export` makes from the per-rank files.
std::map<std::string, F32Tensor> final_params(const fs::path &run_dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d", step);
  const fs::path dir = run_dir / "ckpt" / name;
  if (fs::exists(dir / "model.safetensors")) return read_safetensors_f32(dir / "model.safetensors");
  const fs::path out = run_dir.string() + "-export.safetensors";
  RunResult r = run_cli({"ckpt", "export", dir.string(), "-o", out.string()});
  if (r.status != 0) {
    // Not fatal: the test goes on with the other runs; the comparison then
    // fails for want of parameters.
    FAIL_CHECK("tessera ckpt export " << dir.string() << " failed: " << describe(r));
    return {};
  }
  return read_safetensors_f32(out);
}

struct Trained {
  Job job;
  fs::path dir;
  RunResult run;
  std::vector<int64_t> steps;
  std::vector<double> losses;
  std::map<std::string, F32Tensor> params;
  json summary;
};

// Runs `tessera run -n WORLD` on the job's config and reads what it wrote
// (the final parameters only when `with_params`).
Trained train_job(const Job &j, bool with_params = true) {
  Trained t;
  t.job = j;
  t.dir = scratch() / j.name();
  const fs::path config = scratch() / (j.name() + ".toml");
  write_text(config, fmnist_config(j, t.dir));
  RunOptions o;
  o.timeout_s = 300;
  const double t0 = now_s();
  t.run = run_cli({"run", "-n", std::to_string(j.world), config.string()}, o);
  std::printf("  %-28s %5.1f s\n", j.name().c_str(), now_s() - t0);
  std::fflush(stdout);
  INFO(j.name() << ": " << describe(t.run));
  REQUIRE(t.run.status == 0);
  for (const auto &m : read_jsonl(t.dir / "metrics.jsonl"))
    if (m.value("type", "") == "train") {
      t.steps.push_back(m.at("step").get<int64_t>());
      t.losses.push_back(m.at("loss").get<double>());
    }
  if (with_params) t.params = final_params(t.dir, j.steps);
  t.summary = read_json(t.dir / "summary.json");
  return t;
}

// Tolerances. Loss: 1e-4 relative at every step (the issue's bar). Final
// parameters: |p - p_ref| <= 1e-4 |p_ref| + 1e-5. The absolute floor is 1% of
// one Adam step at lr 1e-3: weights of pixels that are almost always 0 get
// gradients of ~0 whose rounding (summation order across ranks and
// micro-batches) Adam's normalisation turns into updates of up to ~lr; over 50
// steps these drift by a few 1e-6 even between two world-1 runs that differ
// only in accumulation. A wrong average, a lost or stale slice or a skipped
// update moves parameters by ~1e-3.
constexpr double kLossRel = 1e-4, kParamRel = 1e-4, kParamAbs = 1e-5;

void check_equivalent(const Trained &ref, const Trained &t) {
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
    CHECK(worst_loss <= kLossRel);
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
    for (size_t i = 0; i < r.data.size(); ++i) {
      const double a = r.data[i], b = x.data[i];
      const double err = std::fabs(a - b);
      const double ratio = err / (kParamRel * std::fabs(a) + kParamAbs);
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
  INFO("largest parameter difference: " << param_note << ", " << worst
                                        << " of the tolerance 1e-4 |p| + 1e-5");
  CHECK(worst <= 1.0);
}

// Trains the reference (world 1, stage 0, micro = global, the jobs' optimizer
// and clipping) and then every job of `jobs`, each compared with it.
Trained equivalence(int global, const std::vector<Job> &jobs) {
  require_fashion_mnist();
  REQUIRE(!jobs.empty());
  Job r = jobs.front();
  r.world = 1;
  r.stage = 0;
  r.global = r.micro = global;
  const Trained ref = train_job(r);
  for (const Job &j : jobs) {
    REQUIRE(j.global == global);
    REQUIRE((j.sgd == r.sgd && j.clip == r.clip));
    REQUIRE(j.micro * j.accumulation() * j.world == global);
    check_equivalent(ref, train_job(j));
  }
  return ref;
}

std::vector<Job> every_stage(int world, int global, std::vector<int> micros) {
  std::vector<Job> v;
  for (int stage = 0; stage <= 3; ++stage)
    for (int m : micros) v.push_back(Job{world, stage, global, m});
  return v;
}

}  // namespace

TEST_CASE("world size 1: accumulation and every ZeRO stage match the stage-0 run",
          "[distributed][equivalence]") {
  equivalence(64, {Job{1, 0, 64, 16},  // accumulation 4
                   Job{1, 1, 64, 64}, Job{1, 2, 64, 32}, Job{1, 3, 64, 64}, Job{1, 3, 64, 16}});
}

TEST_CASE("world size 2: every ZeRO stage matches the world-1 stage-0 run",
          "[distributed][equivalence]") {
  // micro 32 x accumulation 1 x 2 ranks, and micro 16 x accumulation 2.
  equivalence(64, every_stage(2, 64, {32, 16}));
}

TEST_CASE("world size 3: every ZeRO stage matches the world-1 stage-0 run",
          "[distributed][equivalence]") {
  // A global batch of 64 does not split over 3 ranks (global = micro x
  // accumulation x world), so world size 3 trains at global batch 48 (micro
  // 16 x accumulation 1, and micro 8 x accumulation 2) against a world-1
  // stage-0 reference of global batch 48. The 6400 samples do not split evenly
  // over 3 ranks either: drop_last trims the epoch, which the first 50 steps
  // never reach.
  equivalence(48, every_stage(3, 48, {16, 8}));
}

TEST_CASE("world size 4: every ZeRO stage matches the world-1 stage-0 run",
          "[distributed][equivalence]") {
  // micro 16 x accumulation 1 x 4 ranks, and micro 8 x accumulation 2.
  equivalence(64, every_stage(4, 64, {16, 8}));
}

TEST_CASE("SGD with gradient clipping: every ZeRO stage at world size 4 matches world size 1",
          "[distributed][equivalence]") {
  // Adam's update hardly changes when every gradient is scaled by the same
  // factor, so the runs above would miss gradients summed instead of
  // averaged over ranks. SGD with momentum is linear in the gradient, and
  // clipping at 0.5 (below the MLP's gradient norm for most of these steps)
  // makes every update depend on the global norm across ranks, which stages
  // 2-3 compute from partitioned gradients.
  // One micro-batch split per stage (the Adam runs above cover both with
  // every stage): micro 16 x accumulation 1, or micro 8 x accumulation 2.
  std::vector<Job> jobs;
  for (int stage = 0; stage <= 3; ++stage) {
    Job j{4, stage, 64, stage % 2 == 0 ? 16 : 8};
    j.sgd = true;
    j.clip = 0.5;
    jobs.push_back(j);
  }
  const Trained clipped = equivalence(64, jobs);
  // Clipping is in effect: without it the world-1 run ends elsewhere.
  Job unclipped{1, 0, 64, 64};
  unclipped.sgd = true;
  const Trained b = train_job(unclipped, false);
  REQUIRE(clipped.losses.size() == b.losses.size());
  CHECK(std::fabs(clipped.losses.back() - b.losses.back()) > 1e-3);
}

// ---------------------------------------------------------------------------
// Memory per rank.

namespace {

struct MemoryLine {
  std::string stage;
  double params = -1, grads = -1, optimizer = -1, buffers = -1;  // MiB, 2 decimals
};

// "tessera: memory on rank R (stageN): parameters X MiB, gradients Y MiB,
// optimizer state Z MiB, buffers W MiB", printed by rank 0 at start-up.
MemoryLine memory_line(const std::string &out, int rank) {
  static const std::regex re(
      R"(tessera: memory on rank (\d+) \((\w+)\): parameters ([0-9.]+) MiB, gradients ([0-9.]+) MiB, optimizer state ([0-9.]+) MiB, buffers ([0-9.]+) MiB)");
  MemoryLine m;
  for (const auto &line : lines(out)) {
    std::smatch g;
    if (!std::regex_search(line, g, re) || std::stoi(g[1]) != rank) continue;
    m.stage = g[2];
    m.params = std::stod(g[3]);
    m.grads = std::stod(g[4]);
    m.optimizer = std::stod(g[5]);
    m.buffers = std::stod(g[6]);
  }
  return m;
}

// Peak bytes by purpose on rank 0 (summary.json).
struct Bytes {
  double params = 0, grads = 0, optimizer = 0;
};
Bytes peak_bytes(const json &summary) {
  const json &p = summary.at("peak_memory_by_purpose");
  return Bytes{p.at("parameters").get<double>(), p.at("gradients").get<double>(),
               p.at("optimizer state").get<double>()};
}

}  // namespace

TEST_CASE("memory per rank at world size 4 follows the stage's table", "[distributed][memory]") {
  require_fashion_mnist();
  constexpr int kWorld = 4;
  Job base{1, 0, 64, 16};
  base.steps = 2;
  const Trained one = train_job(base, false);
  const Bytes b1 = peak_bytes(one.summary);

  // The model's groups, from the checkpoint's parameter table: the layout pads
  // each group to a multiple of the world size, so a rank's slice is within
  // one element per group of a quarter.
  const json manifest = read_json(one.dir / "ckpt" / "step_00000002" / "manifest.json");
  std::map<int64_t, double> group_numel;
  double numel = 0;
  for (const auto &p : manifest.at("params")) {
    double n = 1;
    for (const auto &d : p.at("shape")) n *= d.get<double>();
    group_numel[p.at("group").get<int64_t>()] += n;
    numel += n;
  }
  const double groups = static_cast<double>(group_numel.size());
  REQUIRE(groups == 3);  // 784-256-128-10: one group per layer
  // Bytes per parameter at world size 1, per purpose (fp32: 4, 4, and 4 per
  // optimizer array: master + Adam's m and v).
  const double per_param = b1.params / numel, per_grad = b1.grads / numel,
               per_state = b1.optimizer / numel;
  INFO("world 1: " << one.summary.at("peak_memory_by_purpose").dump());
  REQUIRE(per_param == Approx(4));
  REQUIRE(per_grad == Approx(4));
  REQUIRE(per_state >= 4);

  // `got` is a quarter of world 1's `full` within one element per group.
  auto quarter = [&](double got, double full, double per_elem) {
    return std::fabs(got - full / kWorld) <= per_elem * groups;
  };
  // `got` equals world 1's `full` but for the world-4 padding.
  auto whole = [&](double got, double full, double per_elem) {
    return std::fabs(got - full) <= per_elem * (kWorld - 1) * groups;
  };
  // The largest the gathered groups of stage 3 can be: every group live at
  // once, each at its own (padded) size.
  double all_groups = 0;
  for (const auto &[g, n] : group_numel) all_groups += std::ceil(n / kWorld) * kWorld * per_param;

  for (int stage = 0; stage <= 3; ++stage) {
    Job j{kWorld, stage, 64, 16};
    j.steps = 2;
    const Trained t = train_job(j, false);
    const Bytes b = peak_bytes(t.summary);
    INFO("stage " << stage << " at world size 4, rank 0: peak "
                  << t.summary.at("peak_memory_by_purpose").dump()
                  << "\nworld size 1: " << one.summary.at("peak_memory_by_purpose").dump() << "\n"
                  << t.run.out);
    CHECK(t.summary.at("world_size") == kWorld);
    // Every rank's start-up report (MiB with 2 decimals) holds what the
    // stage partitions: a quarter, or the whole but for the padding.
    for (int rank = 0; rank < kWorld; ++rank) {
      INFO("start-up memory line of rank " << rank);
      const MemoryLine m = memory_line(t.run.out, rank);
      CHECK(m.stage == "stage" + std::to_string(stage));
      const double mib = 1048576.0, round = 0.005 * mib;
      auto near = [&](double reported_mib, double full, bool partitioned, double per_elem) {
        const double want = partitioned ? full / kWorld : full;
        return reported_mib >= 0 &&
               std::fabs(reported_mib * mib - want) <= round + per_elem * (kWorld - 1) * groups;
      };
      CHECK(near(m.params, b1.params, stage >= 3, per_param));
      CHECK(near(m.grads, b1.grads, stage >= 2, per_grad));
      CHECK(near(m.optimizer, b1.optimizer, stage >= 1, per_state));
    }
    // Peaks over the run (rank 0's, from summary.json), in bytes.
    // Optimizer state: partitioned from stage 1 on.
    if (stage >= 1)
      CHECK(quarter(b.optimizer, b1.optimizer, per_state));
    else
      CHECK(whole(b.optimizer, b1.optimizer, per_state));
    // Gradients: partitioned from stage 2 on.
    if (stage >= 2)
      CHECK(quarter(b.grads, b1.grads, per_grad));
    else
      CHECK(whole(b.grads, b1.grads, per_grad));
    // Parameters: whole up to stage 2. Stage 3 keeps a quarter (what it holds
    // at start-up, before any gather) plus the groups gathered for use.
    if (stage < 3) {
      CHECK(whole(b.params, b1.params, per_param));
    } else {
      CHECK(b.params > b1.params / kWorld);  // it did gather
      INFO("stage 3 may hold a quarter (" << b1.params / kWorld << " bytes) plus live groups ("
                                          << all_groups << " bytes if all three are live)");
      CHECK(b.params <= b1.params / kWorld + per_param * groups + all_groups);
    }
  }
}

// ---------------------------------------------------------------------------
// Faults and the launcher, on the harness's small synthetic task.

namespace {

// `tessera run -n N` arguments for a long run of the synthetic task.
std::vector<std::string> long_run(const Setup &s, int n, int64_t steps = 1000000) {
  return {"run",
          "-n",
          std::to_string(n),
          s.config.string(),
          "--set",
          "run.steps=" + std::to_string(steps),
          "--set",
          "run.log_every=10"};
}

// The launcher's workers, by rank (RANK in their environment), once all `n`
// are there.
std::map<int, int> workers_of(Process &launcher, int n, double timeout_s = 30) {
  const double until = now_s() + timeout_s;
  std::map<int, int> by_rank;
  while (now_s() < until && !launcher.poll()) {
    by_rank.clear();
    for (int pid : child_pids(launcher.pid)) {
      const std::string r = process_env(pid, "RANK");
      if (!r.empty()) by_rank[std::stoi(r)] = pid;
    }
    if (static_cast<int>(by_rank.size()) == n) return by_rank;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return by_rank;
}

// Waits until the process exits or `timeout_s` passes; true if it exited.
bool exits_within(Process &p, double timeout_s) {
  const double until = now_s() + timeout_s;
  while (!p.poll()) {
    if (now_s() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::string still_running(const std::map<int, int> &workers) {
  std::string s;
  for (const auto &[rank, pid] : workers)
    if (process_running(pid))
      s += "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") ";
  return s;
}

}  // namespace

TEST_CASE("a worker killed with SIGKILL stops the job within 10 s, naming its rank",
          "[distributed][faults]") {
  Setup s = setup();
  RunOptions o;
  o.timeout_s = 180;
  Process launcher = start_cli(long_run(s, 3), o);
  const bool training = wait_for_text(launcher, "[rank 0] step", 120);
  INFO("launcher output so far:\n" << launcher.out() << launcher.err());
  REQUIRE(training);
  const std::map<int, int> workers = workers_of(launcher, 3);
  REQUIRE(workers.size() == 3);

  REQUIRE(::kill(workers.at(1), SIGKILL) == 0);
  const double killed_at = now_s();
  const bool exited = exits_within(launcher, 30);
  const double took = now_s() - killed_at;
  RunResult r = launcher.wait();
  INFO(describe(r));
  REQUIRE(exited);
  CHECK(took <= 10.0);
  CHECK(r.status != 0);
  const std::string verdict = launcher_verdict(r.err);
  INFO("verdict: " << verdict);
  CHECK(starts_with(verdict, "tessera run: failed: rank 1 "));
  CHECK(contains(verdict, "SIGKILL"));
  CHECK(still_running(workers) == "");
}

TEST_CASE("a rank that fails inside the job stops every other rank promptly with its reason",
          "[distributed][faults]") {
  // faulty-sgd (tests/plugins/faulty_optimizer.c) fails on rank 1 at step 5;
  // the other ranks are then on their way into step 6's collectives, which
  // rank 1 never joins. comm.timeout_s is 60: the abort key, not the
  // collective's timeout, must end them.
  Setup s = setup();
  for (int stage : {0, 2}) {
    INFO("zero stage " << stage);
    std::vector<std::string> args = long_run(s, 3, 1000);
    args.insert(
        args.end(),
        {"--plugin-path", TESSERA_FAULT_PLUGIN_DIR, "--set", "optimizer.plugin=\"faulty-sgd\"",
         "--set", "optimizer.fail_rank=1", "--set", "optimizer.fail_step=5", "--set",
         "comm.timeout_s=60", "--set", "zero.plugin=\"stage" + std::to_string(stage) + "\"",
         "--set", "run.dir=\"" + (scratch() / ("fail" + std::to_string(stage))).string() + "\""});
    RunOptions o;
    o.timeout_s = 120;
    Process launcher = start_cli(args, o);
    const std::map<int, int> workers = workers_of(launcher, 3);
    RunResult r = launcher.wait();
    const double took = launcher.elapsed();
    INFO(describe(r));
    REQUIRE(workers.size() == 3);
    CHECK(r.status != 0);
    CHECK(took < 20.0);
    const std::string reason = "faulty-sgd: injected failure on rank 1 at step 5";
    // Every other rank stops with "rank 1 failed" and the reason.
    for (int rank : {0, 2}) {
      INFO("rank " << rank);
      CHECK(any_line_has(rank_lines(r.err, rank), {"rank 1 failed", reason}));
    }
    // The failing rank reports its own error.
    CHECK(any_line_has(rank_lines(r.err, 1), {reason}));
    // The launcher names rank 1, the rank that failed, not one that stopped
    // because of it.
    const std::string verdict = launcher_verdict(r.err);
    INFO("verdict: " << verdict);
    CHECK(starts_with(verdict, "tessera run: failed: rank 1 "));
    CHECK(contains(verdict, reason));
    CHECK(still_running(workers) == "");
  }
}

TEST_CASE("a rank that crashes inside the job stops the job promptly, naming it",
          "[distributed][faults]") {
  // faulty-sgd with mode "exit": rank 1 _exit(3)s at step 5 without posting
  // a reason; the others lose their peer inside a collective.
  Setup s = setup();
  std::vector<std::string> args = long_run(s, 3, 1000);
  args.insert(args.end(), {"--plugin-path", TESSERA_FAULT_PLUGIN_DIR, "--set",
                           "optimizer.plugin=\"faulty-sgd\"", "--set", "optimizer.mode=\"exit\"",
                           "--set", "comm.timeout_s=60"});
  RunOptions o;
  o.timeout_s = 120;
  Process launcher = start_cli(args, o);
  const std::map<int, int> workers = workers_of(launcher, 3);
  RunResult r = launcher.wait();
  const double took = launcher.elapsed();
  INFO(describe(r));
  REQUIRE(workers.size() == 3);
  CHECK(r.status != 0);
  CHECK(took < 20.0);
  CHECK(any_line_has(rank_lines(r.err, 1), {"injected failure on rank 1 at step 5"}));
  const std::string verdict = launcher_verdict(r.err);
  INFO("verdict: " << verdict);
  CHECK(starts_with(verdict, "tessera run: failed: rank 1 exited with status 3"));
  CHECK(still_running(workers) == "");
}

TEST_CASE("tessera run -n 2 prefixes output with the rank and only rank 0 reports progress",
          "[distributed][launcher]") {
  Setup s = setup();
  RunOptions o;
  o.timeout_s = 120;
  RunResult r = run_cli({"run", "-n", "2", s.config.string()}, o);
  INFO(describe(r));
  REQUIRE(r.status == 0);
  for (const std::string *text : {&r.out, &r.err})
    for (const auto &line : lines(*text)) {
      if (line.empty()) continue;
      INFO("line: " << line);
      CHECK((starts_with(line, "[rank 0] ") || starts_with(line, "[rank 1] ") ||
             line == "[rank 0]" || starts_with(line, "tessera run: ")));
    }
  int progress = 0;
  for (const auto &line : rank_lines(r.out, 0))
    if (starts_with(line, "[rank 0] step ") && contains(line, "loss")) ++progress;
  CHECK(progress == 6);  // steps 10, 20, ..., 60
  CHECK(contains(r.out, "[rank 0] step 60/60"));
  // Rank 1 prints no progress, summary or memory report (only warnings and
  // errors, on stderr).
  CHECK(rank_lines(r.out, 1).empty());
  CHECK(!any_line_has(rank_lines(r.err, 1), {"step "}));
  json sum = read_json(s.run_dir / "summary.json");
  CHECK(sum.at("world_size") == 2);
  CHECK(sum.at("steps") == 60);
  CHECK(sum.at("samples") == 60 * 32 * 2);
}

TEST_CASE("SIGTERM to the launcher stops every worker cleanly: they save and it exits 0",
          "[distributed][launcher]") {
  Setup s = setup();
  RunOptions o;
  o.timeout_s = 180;
  Process launcher = start_cli(long_run(s, 2), o);
  const bool training = wait_for_text(launcher, "[rank 0] step", 120);
  INFO("launcher output so far:\n" << launcher.out() << launcher.err());
  REQUIRE(training);
  const std::map<int, int> workers = workers_of(launcher, 2);
  REQUIRE(workers.size() == 2);
  REQUIRE(::kill(launcher.pid, SIGTERM) == 0);
  const double sent = now_s();
  const bool exited = exits_within(launcher, 30);
  const double took = now_s() - sent;
  RunResult r = launcher.wait();
  INFO(describe(r));
  REQUIRE(exited);
  CHECK(took <= 10.0);
  // Preemption: the workers save a checkpoint and exit 0, and so does the
  // launcher (a job scheduler may requeue it to resume).
  CHECK(r.status == 0);
  CHECK(contains(r.err, "SIGTERM"));
  CHECK(contains(r.out, "stopped by a signal"));
  CHECK(fs::exists(s.run_dir / "ckpt" / "latest"));
  CHECK(still_running(workers) == "");
}

TEST_CASE("workers started by another launcher train as tessera run -n 2 does",
          "[distributed][launcher]") {
  // Two workers started here with torchrun's variables and no
  // TESSERA_LAUNCHED: rank 0 serves the rendezvous store itself. ZeRO stage
  // 2, as the quickstart trains.
  Setup s = setup("\n[zero]\nplugin = \"stage2\"\n");
  const fs::path own = scratch() / "own", ours = scratch() / "ours";
  std::vector<RunResult> results;
  for (int attempt = 0; attempt < 3 && results.empty(); ++attempt) {
    // free_port() only says the port was free a moment ago.
    const int port = free_port();
    std::vector<Process> workers;
    for (int rank = 0; rank < 2; ++rank) {
      RunOptions o;
      o.timeout_s = 120;
      o.env = {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", "2"},
               {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", "2"},
               {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)}};
      o.unset_env = {"TESSERA_LAUNCHED", "TESSERA_NODE_RANK"};
      workers.push_back(
          start_cli({"run", s.config.string(), "--set", "run.dir=\"" + own.string() + "\""}, o));
    }
    RunResult r0 = workers[0].wait();
    if (r0.status != 0 && contains(r0.err, "already in use")) continue;  // rank 1 is killed
    results = {r0, workers[1].wait()};
  }
  REQUIRE(results.size() == 2);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << describe(results[static_cast<size_t>(rank)]));
    CHECK(results[static_cast<size_t>(rank)].status == 0);
  }
  RunOptions o;
  o.timeout_s = 120;
  RunResult r = run_cli(
      {"run", "-n", "2", s.config.string(), "--set", "run.dir=\"" + ours.string() + "\""}, o);
  INFO(describe(r));
  REQUIRE(r.status == 0);

  REQUIRE(fs::exists(own / "summary.json"));
  CHECK(read_json(own / "summary.json").at("world_size") == 2);
  const auto a = train_losses(read_jsonl(own / "metrics.jsonl"));
  const auto b = train_losses(read_jsonl(ours / "metrics.jsonl"));
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("logged loss " << i << ": " << a[i] << " vs " << b[i]);
    CHECK(std::fabs(a[i] - b[i]) <= 1e-6 * std::fabs(b[i]));
  }
  const auto pa = final_params(own, 60), pb = final_params(ours, 60);
  REQUIRE(!pb.empty());
  REQUIRE(pa.size() == pb.size());
  for (const auto &[name, t] : pb) {
    INFO(name);
    REQUIRE(pa.count(name) == 1);
    REQUIRE(pa.at(name).data.size() == t.data.size());
    double worst = 0;
    for (size_t i = 0; i < t.data.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(pa.at(name).data[i]) - t.data[i]) /
                                  (1e-6 * std::fabs(t.data[i]) + 1e-7));
    CHECK(worst <= 1.0);
  }
}
