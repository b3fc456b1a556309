// run and eval: the commands that train or evaluate a config (config check
// and convert: config_cmd.cpp).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/args.hpp"
#include "cli/command_support.hpp"
#include "cli/debug_flags.hpp"
#include "cli/deepspeed_forms.hpp"
#include "comm/dist_context.hpp"
#include "config/config.hpp"
#include "launch/hostfile.hpp"
#include "launch/job_secret.hpp"
#include "launch/launcher.hpp"
#include "launch/ssh_launch.hpp"
#include "train/device_select.hpp"
#include "train/job.hpp"
#include "train/monitor.hpp"
#include "train/run_lock.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"

namespace tessera::cli {

namespace {

const char *kRunUsage = R"(usage: tessera run [-n N] CONFIG [options]
       tessera run --hostfile FILE CONFIG [options]
       tessera run [--num_gpus N] --deepspeed --deepspeed_config ds.json [--model M --data D]

Trains the job in CONFIG (TOML, a DeepSpeed JSON on top of one, or a
DeepSpeed JSON alone: its model and data from --model/--data or from the
TOML of the same name beside it, ds.toml for ds.json).
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
  --job-secret-file FILE    the rendezvous store's secret (mode 600; the same on every
                            node; needed with --nnodes > 1 unless TESSERA_JOB_SECRET is
                            set). One node: the launcher makes one. docs/security.md
  --max-restarts K          when a worker fails, restart every worker from the
                            latest checkpoint, at most K times
  --grace S                 after Ctrl-C or SIGTERM, seconds the workers get to
                            save a checkpoint before SIGKILL (default 30)
  --watch-stdin             stop the workers when standard input ends (as on
                            SIGTERM), or at once on a "stop" line: how a node
                            launcher started by --hostfile follows its ssh session

several nodes over ssh (docs/multi-node.md):
  --hostfile FILE           DeepSpeed's hostfile: 'HOST slots=N' lines, '#' comments.
                            Starts one node launcher per host over ssh (in this
                            directory, with this binary's path), each with
                            -n SLOTS; node r holds ranks r*SLOTS..; a failure on
                            any node stops every node
  --include SPEC            only these hosts/slots: 'host1:0,2@host2'
  --exclude SPEC            all but these hosts/slots (same syntax)
  --num_nodes N             the first N hosts of the hostfile
  --num_gpus N              the first N slots of each host
  --master HOST:PORT        the store's address (default: the first host, port
                            --master-port)
  --master-port P           the store's port when --master is not given (29500)
  --ssh-port P              ssh to this port (default: ssh's, ~/.ssh/config)
  --ssh-opts "OPTS"         more ssh options (also TESSERA_SSH_OPTS), e.g. "-F cfg"
  --env NAME[=VALUE]        forward NAME (repeatable); NCCL_*, GLOO_* and
                            TESSERA_* variables and ~/.tessera_env and
                            ./.tessera_env (KEY=VALUE lines) are forwarded anyway
  --dry-run                 print each node's ssh command and exit

DeepSpeed's launcher options, on one node (each mapping is printed at start):
  --num_gpus N              -n N, the workers seeing the first N devices
                            (CUDA_VISIBLE_DEVICES, or 0..N-1)
  --include localhost:0,1   -n 2, the workers seeing devices 0 and 1
  --exclude localhost:1     all of --num_gpus N (or CUDA_VISIBLE_DEVICES) but 1
  --num_nodes 1             this node (more nodes need --hostfile)
  --master_addr A --master_port P
                            --master A:P
  --deepspeed               DeepSpeed's switch: nothing to switch on

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
  --unset KEY               remove a key or a whole section, e.g. --unset optimizer.momentum
                            when --set optimizer.plugin=adam replaces sgd (repeatable;
                            removals apply before every --set)
  --deepspeed_config FILE   layer a DeepSpeed JSON config over CONFIG (also --deepspeed FILE);
                            without CONFIG, the JSON alone
  --model M                 [model] from the TOML file M, or the model plugin named M
  --data D                  [data] from the TOML file D, or [data.train]'s plugin named D
  --plugin-path DIR         search DIR for plugins first (repeatable)
  --local_rank N            the local rank of a worker started by another launcher (as
                            DeepSpeed's passes it; must agree with LOCAL_RANK). Refused
                            with -n, --num_gpus or --hostfile: each worker gets its own
  --verbose                 debug logging
  -h, --help                this help

The run directory (run.dir, default runs/<run.name>) receives config.toml
(the resolved config), metrics.jsonl and summary.json.
)";

const char *kEvalUsage = R"(usage: tessera eval CONFIG --ckpt PATH [-n N] [options]
       tessera eval CONFIG --init-from HF_DIR [-n N] [options]

Evaluates a model, frozen (no gradients, no optimizer state), on the
config's [data.eval] dataset (or [data.train] when there is none): the mean
loss over every target and, for a classifier, the accuracy. With -n N, N
workers each evaluate a contiguous share of the samples (no sample twice,
none left out) and the loss sums, target counts and correct counts are
summed over the ranks, so the result is the one-process result.

  --ckpt PATH               a checkpoint directory (step_NNNNNNNN), a checkpoint
                            root holding 'latest', or a .safetensors file
  --init-from HF_DIR        no checkpoint: the [model] plugin's own weights from a
                            Hugging Face directory (config.json + model.safetensors).
                            The same as --set model.init_from='HF_DIR', for a model
                            plugin that declares init_from (llama: docs/llama.md)
  -n, --nproc N             workers on this node (as for 'tessera run')
  --set KEY=VALUE           override a config key (repeatable)
  --unset KEY               remove a key or a whole section (repeatable)
  --deepspeed_config FILE   layer a DeepSpeed JSON config over CONFIG
  --model M, --data D       the model and data of a DeepSpeed JSON (as for 'tessera run')
  --plugin-path DIR         search DIR for plugins first (repeatable)
  --local_rank N            accepted for DeepSpeed-style launchers
  -h, --help                this help

Prints one line ('eval | loss ...') and the result as JSON.
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

// CONFIG: the one positional argument, or DeepSpeed's form without one
// (`--deepspeed_config ds.json` alone: the JSON is the config).
std::string config_of(const Parsed &p, const std::string &command) {
  if (p.positional.size() == 1) return p.positional[0];
  if (p.positional.empty() && p.has("--deepspeed_config")) return p.get("--deepspeed_config");
  throw UsageError("tessera " + command + ": expected exactly one CONFIG file");
}

}  // namespace

JobOptions job_options(const Parsed &p, const std::string &command) {
  JobOptions o;
  o.config_path = config_of(p, command);
  if (!p.positional.empty()) o.deepspeed_path = p.get("--deepspeed_config");
  o.model = p.get("--model");
  o.data = p.get("--data");
  o.sets = p.all("--set");
  o.unsets = p.all("--unset");
  o.plugin_paths = p.all("--plugin-path");
  return o;
}

namespace {

// Set by the launcher for its workers once it has checked the config and
// printed its warnings: the workers then keep quiet about them.
constexpr const char *kConfigCheckedVar = "TESSERA_CONFIG_CHECKED";

}  // namespace

void print_warnings(const Job &job) {
  if (std::getenv(kConfigCheckedVar)) return;  // the launcher printed them, once per job
  for (const auto &n : job.doc.notes()) spdlog::info("{}", n);
  for (const auto &w : job.doc.warnings()) spdlog::warn("{}", w);
  for (const auto &r : job.registry->refusals()) spdlog::warn("plugin refused: {}", r);
}

namespace {

int int_option(const Parsed &p, const std::string &name, int fallback) {
  std::string v = p.get(name);
  if (v.empty()) return fallback;
  char *end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20)
    throw UsageError(name + " '" + v + "' is not a valid count");
  return static_cast<int>(x);
}

// "run" and `args` minus the options `with_value` (and their values) and
// the flags `flags`.
std::vector<std::string> without_options(const Args &args,
                                         const std::vector<std::string> &with_value,
                                         const std::vector<std::string> &flags) {
  std::vector<std::string> out = {"run"};
  for (size_t i = 0; i < args.size(); ++i) {
    bool skip = false;
    for (const auto &opt : with_value) {
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
    for (const auto &f : flags) skip = skip || args[i] == f;
    if (!skip) out.push_back(args[i]);
  }
  return out;
}

// The arguments a worker gets: ours minus the launcher's own options.
std::vector<std::string> worker_args(const Args &args) {
  // The --debug-* options reach the workers as TESSERA_DEBUG_* variables.
  static const std::vector<std::string> launcher_opts = {
      "-n",           "--nproc",        "--nnodes",         "--node-rank",
      "--master",     "--max-restarts", "--grace",          "--debug-rank",
      "--debug-wait", "--debug-with",   "--job-secret-file"};
  return without_options(args, launcher_opts, {"--watch-stdin"});
}

// The arguments the node launchers of a --hostfile job get after `tessera
// run`: ours minus the head's own options (--max-restarts, --grace and the
// --debug-* options go on to them).
std::vector<std::string> node_args(const Args &args) {
  static const std::vector<std::string> head_opts = {
      "-n",         "--nproc",       "--nnodes",      "--node-rank",
      "--master",   "--master-port", "--master_port", "--hostfile",
      "--include",  "--exclude",     "--num_nodes",   "--num_gpus",
      "--ssh-port", "--ssh-opts",    "--env",         "--job-secret-file"};
  std::vector<std::string> out = without_options(args, head_opts, {"--dry-run", "--watch-stdin"});
  out.erase(out.begin());  // "run"
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
  opt.shm = job.settings.comm_shm;
  opt.heartbeat_timeout_s = static_cast<int>(job.settings.comm_heartbeat_timeout_s);
  auto dist = std::make_unique<DistContext>(opt);
  proc.comm = dist->comm();
  proc.transport = dist->transport();
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
  // [monitor]: the trainer's Reporter picks these up by run directory.
  set_run_monitors(job.settings.dir, job.settings.monitor);
  try {
    // Rank 0 holds the run and checkpoint directories for the job's life,
    // and has found them writable, before anything is written to either.
    std::unique_ptr<RunLock> lock;
    if (proc.rank == 0)
      lock = std::make_unique<RunLock>(
          std::vector<std::string>{job.settings.dir, job.settings.ckpt_dir},
          std::vector<std::string>{"run.dir", "checkpoint.dir"});
    train(job, proc);
  } catch (const std::exception &e) {
    // What the user reads, here, in the summary and from the launcher.
    const std::string why = error_for_user(e);
    // A failed run's summary says so. Under our launcher the launcher
    // writes it (it knows which rank failed first); alone, this process.
    if (!dist) {
      write_failed_summary(job.settings.dir, job.settings.name, why, 0, 1);
      throw;
    }
    // Say why first (the launcher may stop us soon after), then tell the
    // other ranks at once instead of leaving them in a collective.
    std::fprintf(stderr, "tessera run: error on rank %u: %s\n", proc.rank, why.c_str());
    std::fflush(stderr);
    // A collective failing under us usually means a peer died first: say so,
    // so the launcher names that peer rather than us.
    const auto *err = dynamic_cast<const Error *>(&e);
    const bool lost_peer = err && err->code() == TSR_ERR_COMM;
    // Another launcher (torchrun, mpirun, Slurm) writes no summary: the
    // rank that failed on its own does (rank 0 may hold the lock still, so
    // it is not asked), unless the directory is another job's.
    if (!lost_peer && !std::getenv("TESSERA_LAUNCHED") && !dynamic_cast<const RunDirInUse *>(&e))
      write_failed_summary(job.settings.dir, job.settings.name,
                           "rank " + std::to_string(proc.rank) + " failed: " + why,
                           static_cast<int>(proc.rank), proc.world_size, false);
    dist->post_abort(std::string(lost_peer ? "[comm] " : "") + why);
    return lost_peer ? kStoppedByPeerStatus : 1;
  }
  return 0;
}

// comm.interface as the workers will resolve it (config, DeepSpeed JSON,
// --set, then GLOO_SOCKET_IFNAME): node 0's launcher serves the store on its
// address. A config that does not load is the workers' to report.
std::string configured_interface(const Parsed &p) {
  std::string iface;
  try {
    JobOptions o = job_options(p, "run");
    config::Document doc = config::Document::load(o.config_path);
    if (!o.deepspeed_path.empty()) doc.apply_deepspeed(o.deepspeed_path);
    for (const auto &u : o.unsets) doc.unset(u);
    for (const auto &s : o.sets) doc.apply_set(s);
    if (const toml::node *n = config::find(doc.root(), "comm.interface"))
      if (auto v = n->value<std::string>()) iface = *v;
  } catch (const std::exception &) {
  }
  if (iface.empty())
    if (const char *e = std::getenv("GLOO_SOCKET_IFNAME")) iface = e;
  return iface;
}

// `tessera run --hostfile FILE`: one node launcher per host, over ssh.
int run_hostfile(const Parsed &p) {
  for (const char *o : {"-n", "--nproc", "--nnodes", "--node-rank"})
    if (p.has(o))
      throw UsageError(std::string("tessera run: ") + o +
                       " cannot be used with --hostfile (the hostfile gives the nodes and slots)");
  auto count = [&](const char *name) { return p.has(name) ? int_option(p, name, 0) : -1; };
  SshLaunchOptions so;
  so.hosts = select_hosts(parse_hostfile(p.get("--hostfile")), p.get("--include"),
                          p.get("--exclude"), count("--num_nodes"), count("--num_gpus"));
  so.master = p.get("--master");
  if (so.master.empty()) {
    const char *name = p.has("--master-port") ? "--master-port" : "--master_port";
    const int v = int_option(p, name, 29500);
    if (v < 1 || v > 65535)
      throw UsageError(std::string(name) + ": " + std::to_string(v) + " is not a port");
    so.master = so.hosts.front().host + ":" + std::to_string(v);
  }
  so.ssh_port = count("--ssh-port");
  if (so.ssh_port > 65535) throw UsageError("--ssh-port: not a port");
  if (const char *e = std::getenv("TESSERA_SSH_OPTS")) so.ssh_opts = split_words(e);
  for (const auto &w : split_words(p.get("--ssh-opts"))) so.ssh_opts.push_back(w);
  std::vector<std::string> notes;
  so.env = forwarded_env(p.all("--env"), &notes);
  for (const auto &n : notes) spdlog::info("{}", n);
  if (p.has("--grace")) so.grace_s = int_option(p, "--grace", 30);
  so.dry_run = p.has("--dry-run");
  so.job_secret = launcher_job_secret(p.get("--job-secret-file"), false, 1);
  return launch_over_ssh(so, node_args(*g_run_args));
}

// --local_rank names the one worker a launcher started; given to ours,
// which starts several, every worker would get the same one (on a GPU
// host, the same GPU): each gets its own LOCAL_RANK instead.
void refuse_local_rank(const Parsed &p) {
  for (const char *o : {"--local_rank", "--local-rank"})
    if (p.has(o))
      throw UsageError(std::string("tessera run: ") + o + " " + p.get(o) +
                       " is what a launcher gives each worker it starts; this launcher starts " +
                       "several and gives each its own LOCAL_RANK: remove " + o +
                       " (docs/distributed.md, \"Local rank\")");
}

int run_body(const Parsed &p) {
  if (p.has("--hostfile")) {
    config_of(p, "run");
    refuse_local_rank(p);
    return run_hostfile(p);
  }
  // (--include, --exclude, --num_gpus and --num_nodes 1 on one node were
  // mapped onto -n by map_deepspeed_forms.)
  for (const char *o : {"--include", "--exclude", "--num_nodes", "--num_gpus", "--ssh-port",
                        "--ssh-opts", "--env", "--dry-run"})
    if (p.has(o)) throw UsageError(std::string("tessera run: ") + o + " needs --hostfile");
  int n = int_option(p, "-n", int_option(p, "--nproc", 1));
  int nnodes = int_option(p, "--nnodes", 1);
  const bool watch = p.has("--watch-stdin");
  export_debug_flags(p, n <= 1 && nnodes <= 1 && !watch ? 0 : n * nnodes);
  if (n <= 1 && nnodes <= 1 && !watch) return train_here(p);
  config_of(p, "run");
  refuse_local_rank(p);
  LaunchOptions lo;
  lo.watch_stdin = watch;
  lo.interface = configured_interface(p);
  lo.nproc = n;
  lo.nnodes = nnodes;
  lo.node_rank = int_option(p, "--node-rank", 0);
  lo.master = p.get("--master");
  lo.max_restarts = int_option(p, "--max-restarts", 0);
  lo.job_secret_file = p.get("--job-secret-file");
  if (p.has("--grace")) lo.grace_s = int_option(p, "--grace", 30);
  // The config is checked here, before any worker starts: an error is
  // printed once, not once per rank, and so are the warnings (one node
  // speaks for the job).
  Job job = load_job(job_options(p, "run"), static_cast<uint32_t>(n * nnodes), true);
  if (lo.node_rank == 0) print_warnings(job);
  ::setenv(kConfigCheckedVar, "1", 1);
  LaunchOutcome outcome;
  lo.outcome = &outcome;
  const int status = launch(lo, worker_args(*g_run_args));
  if (status != 0 && lo.node_rank == 0 && (outcome.failed_rank >= 0 || !outcome.reason.empty())) {
    const std::string at =
        write_failed_summary(job.settings.dir, job.settings.name, outcome.reason,
                             outcome.failed_rank, static_cast<uint32_t>(n * nnodes));
    if (!at.empty())
      std::fprintf(stderr, "tessera run: the failure is recorded in %s\n", at.c_str());
  }
  return status;
}

// Where an eval worker under `tessera eval -n N` leaves rank 0's result for
// the launcher to print (the workers' own output is prefixed by rank).
constexpr const char *kEvalResultVar = "TESSERA_EVAL_RESULT";

void print_eval(const nlohmann::json &r) {
  std::printf("eval | loss %.4f", r["eval_loss"].get<double>());
  if (!r["eval_accuracy"].is_null())
    std::printf(" | accuracy %.4f", r["eval_accuracy"].get<double>());
  const std::string from = r.contains("init_from") ? r["init_from"].get<std::string>()
                                                   : r["checkpoint"].get<std::string>();
  std::printf(" | %lld samples | %s\n", static_cast<long long>(r["samples"].get<int64_t>()),
              from.c_str());
  std::cout << r.dump() << std::endl;
}

// --init-from HF_DIR as the override it stands for: model.init_from, a
// string the model plugin declares (the engine reads only the file the
// plugin then names, through TSR_EXT_MODEL_INIT_FROM).
std::string init_from_set(const std::string &dir) {
  if (dir.find('\'') == std::string::npos) return "model.init_from='" + dir + "'";
  std::string quoted;
  for (char c : dir) quoted += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return "model.init_from=\"" + quoted + "\"";
}

JobOptions eval_options(const Parsed &p) {
  JobOptions o = job_options(p, "eval");
  const bool ckpt = p.has("--ckpt"), init = p.has("--init-from");
  if (ckpt == init)
    throw UsageError(ckpt ? "tessera eval: --ckpt and --init-from exclude each other"
                          : "tessera eval: --ckpt PATH or --init-from HF_DIR is required");
  if (init) o.sets.push_back(init_from_set(p.get("--init-from")));
  return o;
}

Job load_eval_job(const Parsed &p, uint32_t world_size) {
  try {
    return load_job(eval_options(p), world_size, false);
  } catch (const config::ConfigError &e) {
    if (!p.has("--init-from") || std::string(e.what()).find("init_from") == std::string::npos)
      throw;
    throw config::ConfigError(std::string(e.what()) +
                              " (tessera eval --init-from sets model.init_from: the [model] "
                              "plugin must declare it, as llama does)");
  }
}

const Args *g_eval_args = nullptr;

// `tessera eval -n N`: the config checked once here, N workers, and rank 0's
// result printed as one process prints it.
int eval_launch(const Parsed &p, int n) {
  Job job = load_eval_job(p, static_cast<uint32_t>(n));
  print_warnings(job);
  ::setenv(kConfigCheckedVar, "1", 1);
  std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-eval-XXXXXX").string();
  const int fd = mkstemp(tmpl.data());
  if (fd < 0) throw Error(TSR_ERR_IO, "cannot create " + tmpl);
  ::close(fd);
  const std::string path = tmpl;
  ::setenv(kEvalResultVar, path.c_str(), 1);
  LaunchOptions lo;
  lo.nproc = n;
  lo.interface = configured_interface(p);
  std::vector<std::string> args = without_options(*g_eval_args, {"-n", "--nproc"}, {});
  args[0] = "eval";
  const int status = launch(lo, args);
  std::ifstream f(path);
  nlohmann::json r = status == 0 ? nlohmann::json::parse(f, nullptr, false) : nlohmann::json();
  std::remove(path.c_str());
  if (status != 0) return status;
  if (!r.is_object()) throw Error(TSR_ERR_INTERNAL, "the eval workers left no result");
  print_eval(r);
  return 0;
}

int eval_body(const Parsed &p) {
  const int n = int_option(p, "-n", int_option(p, "--nproc", 1));
  if (n > 1) return eval_launch(p, n);
  ProcessInfo proc = process_info(local_rank_of(p));
  if (proc.rank != 0) spdlog::set_level(spdlog::level::warn);
  Job job = load_eval_job(p, proc.world_size);
  print_warnings(job);
  // Under a launcher every rank evaluates its share and the sums meet.
  std::unique_ptr<DistContext> dist = join_job(job, proc);
  nlohmann::json r = evaluate_checkpoint(job, proc, p.get("--ckpt"));
  if (p.has("--init-from")) r["init_from"] = p.get("--init-from");
  if (proc.rank != 0) return 0;
  if (const char *out = std::getenv(kEvalResultVar); out && *out) {
    std::ofstream f(out, std::ios::trunc);
    f << r.dump();
    if (!f.flush()) throw Error(TSR_ERR_IO, std::string("cannot write ") + out);
    return 0;
  }
  print_eval(r);
  return 0;
}

}  // namespace

// DeepSpeed's forms of `args` in tessera's, the mappings printed once (the
// workers get the mapped arguments); false after printing a usage error.
bool deepspeed_forms(const Args &args, bool launcher, const char *command, const char *usage,
                     Args *out) {
  try {
    DeepSpeedForms f = map_deepspeed_forms(args, launcher, std::getenv("CUDA_VISIBLE_DEVICES"));
    for (const auto &n : f.notes) spdlog::info("tessera {}: {}", command, n);
    if (!f.visible_devices.empty()) ::setenv("CUDA_VISIBLE_DEVICES", f.visible_devices.c_str(), 1);
    *out = std::move(f.args);
    return true;
  } catch (const UsageError &e) {
    std::fprintf(stderr, "%s\n\n%s", e.what(), usage);
    return false;
  }
}

int cmd_run(const Args &given) {
  static Args args;  // the workers' arguments come from here (g_run_args)
  if (!deepspeed_forms(given, true, "run", kRunUsage, &args)) return 2;
  auto specs = config_options();
  for (const char *o :
       {"-n", "--nproc", "--nnodes", "--node-rank", "--master", "--max-restarts", "--grace",
        "--hostfile", "--include", "--exclude", "--num_nodes", "--num_gpus", "--master-port",
        "--master_port", "--ssh-port", "--ssh-opts", "--job-secret-file"})
    specs.push_back({o, true, false});
  specs.push_back({"--env", true, true});
  for (const char *o : {"--dry-run", "--watch-stdin"}) specs.push_back({o, false, false});
  for (const auto &s : debug_option_specs()) specs.push_back(s);
  g_run_args = &args;
  return run_command("run", kRunUsage, run_body, args, specs);
}

int cmd_eval(const Args &given) {
  Args args;
  if (!deepspeed_forms(given, false, "eval", kEvalUsage, &args)) return 2;
  auto specs = config_options();
  for (const char *o : {"--ckpt", "--init-from", "-n", "--nproc"})
    specs.push_back({o, true, false});
  g_eval_args = &args;
  return run_command("eval", kEvalUsage, eval_body, args, specs);
}

}  // namespace tessera::cli
