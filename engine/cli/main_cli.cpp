// Command dispatch and the top-level help.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>

#include "cli/cli.hpp"

namespace tessera::cli {

namespace {

const char *kUsage = R"(tessera: a distributed training engine

usage: tessera <command> [options]

commands:
  run CONFIG        train (tessera run --help)
  eval CONFIG       evaluate a checkpoint with a frozen model
  generate          continue a prompt with a trained language model
                    (tessera generate --ckpt runs/NAME/ckpt --prompt TEXT)
  plugins [show N]  list plugins, or every parameter of one
  plugin new K N    write a new plugin project of kind K named N
  plugin check F    check the model plugin of config F: gradients against
                    finite differences, and the ABI's conventions
  config check F    validate a config and print it resolved
  config convert F  print the TOML equivalent of a DeepSpeed JSON
  ckpt inspect|verify|export PATH
                    look into, check or consolidate a checkpoint
  plot RUN_DIR...   draw runs' loss, lr, throughput and memory as SVG/PNG
  runs [DIR]        list past runs (default: runs/)
  data tokenize F.. text files to token shards (tessera data tokenize --help)
  data encode|decode --tokenizer F
                    text on stdin to ids as JSON, or JSON ids to text
  debug vscode [D]  write D/.vscode/launch.json to debug tessera in VS Code
  env [--json]      what this build and machine give tessera: CUDA, GPUs,
                    NCCL, cuDNN, io_uring, CPU features, plugins
  version           print version and ABI

Run 'tessera <command> --help' for a command's options.
)";

}  // namespace

int main(int argc, char **argv) {
  // Logs go to stderr: stdout carries progress and command output (so
  // `tessera config convert ds.json > ds.toml` writes clean TOML).
  spdlog::set_default_logger(spdlog::stderr_color_mt("tessera"));
  spdlog::set_pattern("[%H:%M:%S] %^%l%$: %v");
  Args args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  std::string cmd = args[0];
  Args rest(args.begin() + 1, args.end());
  if (cmd == "run") return cmd_run(rest);
  if (cmd == "eval") return cmd_eval(rest);
  if (cmd == "plugins") return cmd_plugins(rest);
  if (cmd == "plugin") return cmd_plugin(rest);
  if (cmd == "config") return cmd_config(rest);
  if (cmd == "version" || cmd == "--version") return cmd_version(rest);
  if (cmd == "env") return cmd_env(rest);
  if (cmd == "debug") return cmd_debug(rest);
  if (cmd == "ckpt") return cmd_ckpt(rest);
  if (cmd == "plot") return cmd_plot(rest);
  if (cmd == "runs") return cmd_runs(rest);
  if (cmd == "data") return cmd_data(rest);
  if (cmd == "generate") return cmd_generate(rest);
  std::fprintf(stderr, "tessera: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
  return 2;
}

}  // namespace tessera::cli
