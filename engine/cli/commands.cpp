// run, eval, config: the commands that read a config.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/args.hpp"
#include "cli/debug_flags.hpp"
#include "config/config.hpp"
#include "dist/dist_context.hpp"
#include "launch/launcher.hpp"
#include "train/device_select.hpp"
#include "train/job.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"

namespace tessera::cli {

namespace {

const char *kRunUsage = R"(usage: tessera run [-n N] CONFIG [options]

Trains the job in CONFIG (TOML, or a DeepSpeed JSON on top of one).
Without -n (or with -n 1) training runs in this process, so a debugger can
start it directly. With -n N, N workers of this binary start with RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set;
their output is prefixed with the rank, and if one fails the others are
stopped and the launcher exits non-zero naming it.

launcher:
  -n, --nproc N             workers on this node
  --nnodes M                nodes in the job (default 1)
  --node-rank R             this node's index (0 serves the rendezvous store)
  --master HOST:PORT        where node 0's launcher serves (needed with --nnodes > 1)
  --max-restarts K          when a worker fails, restart every worker from the
                            latest checkpoint, at most K times
  --grace S                 after Ctrl-C or SIGTERM, seconds the workers get to
                            save a checkpoint before SIGKILL (default 30)

A worker started by another launcher (torchrun's RANK/WORLD_SIZE/...,
mpirun's OMPI_COMM_WORLD_*, Slurm's SLURM_PROCID/...) runs without ours.

debugging (docs/debugging.md):
  --debug-rank R            rank R prints its PID and how to attach, then waits
                            for a debugger; repeatable, or a list (0,2), or 'all'.
                            The whole job then runs without collective and
                            store timeouts: a rank held in a debugger stalls
                            the others instead of failing the job
  --debug-wait S            seconds a rank waits for its debugger before going on
                            without one (default 300; 0: until one attaches)
  --debug-with gdb          open gdb attached to each such rank in a terminal of
                            its own (a tmux window inside tmux, else an X
                            terminal); without either, print how to attach

options:
  --set KEY=VALUE           override a config key, e.g. --set optimizer.lr=3e-4 (repeatable)
  --deepspeed_config FILE   layer a DeepSpeed JSON config over CONFIG (also --deepspeed)
  --plugin-path DIR         search DIR for plugins first (repeatable)
  --local_rank N            accepted as DeepSpeed-style launchers pass it (LOCAL_RANK works too)
  --verbose                 debug logging
  -h, --help                this help

The run directory (run.dir, default runs/<run.name>) receives config.toml
(the resolved config), metrics.jsonl and summary.json.
)";

const char *kEvalUsage = R"(usage: tessera eval CONFIG --ckpt PATH [options]

Evaluates a trained model, frozen (no gradients, no optimizer state), on the
config's [data.eval] dataset (or [data.train] when there is none).

  --ckpt PATH               a checkpoint directory (step_NNNNNNNN), a checkpoint
                            root holding 'latest', or a .safetensors file
  --set KEY=VALUE           override a config key (repeatable)
  --deepspeed_config FILE   layer a DeepSpeed JSON config over CONFIG
  --plugin-path DIR         search DIR for plugins first (repeatable)
  --local_rank N            accepted for DeepSpeed-style launchers
  -h, --help                this help
)";

const char *kConfigUsage = R"(usage: tessera config check CONFIG [options]
       tessera config convert DS.json

check    validates CONFIG against the engine's schema and every chosen
         plugin's declared parameters, then prints the resolved config
         (defaults filled in). Options: --set, --deepspeed_config,
         --plugin-path as for 'tessera run'.
convert  prints the TOML equivalent of a DeepSpeed JSON config.
)";

int local_rank_of(const Parsed &p) {
  std::string v = p.get("--local_rank", p.get("--local-rank", ""));
  if (v.empty()) return -1;
  try {
    size_t used = 0;
    int r = std::stoi(v, &used);
    if (used != v.size() || r < 0) throw std::invalid_argument(v);
    return r;
  } catch (const std::exception &) {
    throw UsageError("--local_rank '" + v + "' is not a non-negative integer");
  }
}

JobOptions job_options(const Parsed &p, const std::string &command) {
  if (p.positional.size() != 1)
    throw UsageError("tessera " + command + ": expected exactly one CONFIG file");
  JobOptions o;
  o.config_path = p.positional[0];
  o.deepspeed_path = p.get("--deepspeed_config", p.get("--deepspeed", ""));
  o.sets = p.all("--set");
  o.plugin_paths = p.all("--plugin-path");
  return o;
}

void print_warnings(const Job &job) {
  for (const auto &w : job.doc.warnings()) spdlog::warn("{}", w);
  for (const auto &r : job.registry->refusals()) spdlog::warn("plugin refused: {}", r);
}

int int_option(const Parsed &p, const std::string &name, int fallback) {
  std::string v = p.get(name);
  if (v.empty()) return fallback;
  char *end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20)
    throw UsageError(name + " '" + v + "' is not a valid count");
  return static_cast<int>(x);
}

// The arguments a worker gets: ours minus the launcher's own options.
std::vector<std::string> worker_args(const Args &args) {
  std::vector<std::string> out = {"run"};
  // The --debug-* options reach the workers as TESSERA_DEBUG_* variables.
  static const char *launcher_opts[] = {
      "-n",      "--nproc",      "--nnodes",     "--node-rank", "--master", "--max-restarts",
      "--grace", "--debug-rank", "--debug-wait", "--debug-with"};
  for (size_t i = 0; i < args.size(); ++i) {
    bool skip = false;
    for (const char *o : launcher_opts) {
      std::string opt = o;
      if (args[i] == opt) {
        skip = true;
        ++i;  // and its value
        break;
      }
      if (args[i].rfind(opt + "=", 0) == 0) {
        skip = true;
        break;
      }
    }
    if (!skip) out.push_back(args[i]);
  }
  return out;
}

const Args *g_run_args = nullptr;

// Runs the training in this process, joining a multi-process job when the
// environment says so.
// Joins a multi-process job (store, abort watch, Gloo) when the launcher's
// variables say there is one; the collectives go into `proc`.
std::unique_ptr<DistContext> join_job(const Job &job, ProcessInfo &proc) {
  // The GPU first: NCCL's rendezvous needs it selected.
  proc.device = choose_device(job.settings, proc.local_rank, proc.local_world_size);
  proc.device_chosen = true;
  if (proc.world_size <= 1) return nullptr;
  DistOptions opt = dist_options_from_env(proc.rank, proc.world_size,
                                          static_cast<int>(job.settings.comm_timeout_s),
                                          job.settings.comm_interface);
  opt.cuda = proc.device.device_type == kDLCUDA;
  auto dist = std::make_unique<DistContext>(opt);
  proc.comm = dist->comm();
  proc.comm_state = dist->comm_state();
  return dist;
}

int train_here(const Parsed &p) {
  JobOptions o = job_options(p, "run");
  ProcessInfo proc = process_info(local_rank_of(p));
  if (proc.rank != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 speaks for the job
  Job job = load_job(o, proc.world_size, true);
  print_warnings(job);
  // Before the rendezvous, with the plugins loaded: breakpoints in them
  // bind as soon as a debugger attaches.
  start_debug_job(job, proc.rank, proc.world_size);
  std::unique_ptr<DistContext> dist = join_job(job, proc);
  try {
    train(job, proc);
  } catch (const std::exception &e) {
    if (!dist) throw;
    // Say why first (the launcher may stop us soon after), then tell the
    // other ranks at once instead of leaving them in a collective.
    std::fprintf(stderr, "tessera run: error on rank %u: %s\n", proc.rank, e.what());
    std::fflush(stderr);
    // A collective failing under us usually means a peer died first: say so,
    // so the launcher names that peer rather than us.
    const auto *err = dynamic_cast<const Error *>(&e);
    const bool lost_peer = err && err->code() == TSR_ERR_COMM;
    dist->post_abort(std::string(lost_peer ? "[comm] " : "") + e.what());
    return lost_peer ? kStoppedByPeerStatus : 1;
  }
  return 0;
}

int run_body(const Parsed &p) {
  int n = int_option(p, "-n", int_option(p, "--nproc", 1));
  int nnodes = int_option(p, "--nnodes", 1);
  export_debug_flags(p, n <= 1 && nnodes <= 1 ? 0 : n * nnodes);
  if (n <= 1 && nnodes <= 1) return train_here(p);
  if (p.positional.size() != 1) throw UsageError("tessera run: expected exactly one CONFIG file");
  LaunchOptions lo;
  lo.nproc = n;
  lo.nnodes = nnodes;
  lo.node_rank = int_option(p, "--node-rank", 0);
  lo.master = p.get("--master");
  lo.max_restarts = int_option(p, "--max-restarts", 0);
  if (p.has("--grace")) lo.grace_s = int_option(p, "--grace", 30);
  return launch(lo, worker_args(*g_run_args));
}

int eval_body(const Parsed &p) {
  JobOptions o = job_options(p, "eval");
  if (!p.has("--ckpt")) throw UsageError("tessera eval: --ckpt PATH is required");
  ProcessInfo proc = process_info(local_rank_of(p));
  if (proc.rank != 0) spdlog::set_level(spdlog::level::warn);
  Job job = load_job(o, proc.world_size, false);
  print_warnings(job);
  // Under a launcher every rank evaluates its share and the sums meet.
  std::unique_ptr<DistContext> dist = join_job(job, proc);
  nlohmann::json r = evaluate_checkpoint(job, proc, p.get("--ckpt"));
  if (proc.rank == 0) {
    std::printf("eval | loss %.4f", r["eval_loss"].get<double>());
    if (!r["eval_accuracy"].is_null())
      std::printf(" | accuracy %.4f", r["eval_accuracy"].get<double>());
    std::printf(" | %lld samples | %s\n", static_cast<long long>(r["samples"].get<int64_t>()),
                r["checkpoint"].get<std::string>().c_str());
    std::cout << r.dump() << std::endl;
  }
  return 0;
}

int config_body(const Parsed &p) {
  if (p.positional.empty()) throw UsageError("tessera config: expected 'check' or 'convert'");
  std::string sub = p.positional[0];
  Parsed rest = p;
  rest.positional.erase(rest.positional.begin());
  if (sub == "check") {
    JobOptions o = job_options(rest, "config check");
    Job job = load_job(o, 1, true);
    print_warnings(job);
    std::cout << "# resolved from " << o.config_path << " (valid)\n" << job.resolved_toml() << "\n";
    return 0;
  }
  if (sub == "convert") {
    if (rest.positional.size() != 1)
      throw UsageError("tessera config convert: expected one DeepSpeed JSON file");
    config::Document doc;
    doc.apply_deepspeed(rest.positional[0]);
    for (const auto &w : doc.warnings()) spdlog::warn("{}", w);
    std::cout << "# converted from " << rest.positional[0] << "\n"
              << config::to_toml(doc.root()) << "\n";
    return 0;
  }
  throw UsageError("tessera config: unknown subcommand '" + sub + "' (check, convert)");
}

}  // namespace

int cmd_run(const Args &args) {
  auto specs = config_options();
  for (const char *o :
       {"-n", "--nproc", "--nnodes", "--node-rank", "--master", "--max-restarts", "--grace"})
    specs.push_back({o, true, false});
  for (const auto &s : debug_option_specs()) specs.push_back(s);
  g_run_args = &args;
  return run_command("run", kRunUsage, run_body, args, specs);
}

int cmd_eval(const Args &args) {
  auto specs = config_options();
  specs.push_back({"--ckpt", true, false});
  return run_command("eval", kEvalUsage, eval_body, args, specs);
}

int cmd_config(const Args &args) {
  return run_command("config", kConfigUsage, config_body, args, config_options());
}

}  // namespace tessera::cli
