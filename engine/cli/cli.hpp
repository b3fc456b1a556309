// The tessera command line: one function per command.
#pragma once

#include <string>
#include <vector>

namespace tessera::cli {

int main(int argc, char **argv);

using Args = std::vector<std::string>;
int cmd_run(const Args &args);
int cmd_eval(const Args &args);
int cmd_plugins(const Args &args);
int cmd_plugin(const Args &args);
int cmd_plugin_check(const Args &args);  // `plugin check` (plugin_check.cpp)
int cmd_config(const Args &args);
int cmd_version(const Args &args);
int cmd_env(const Args &args);  // `env` (env_cmd.cpp)
int cmd_debug(const Args &args);
int cmd_ckpt(const Args &args);
int cmd_plot(const Args &args);
int cmd_runs(const Args &args);
int cmd_data(const Args &args);
int cmd_data_encode(const Args &args);  // `data encode` (data_codec_cmd.cpp)
int cmd_data_decode(const Args &args);  // `data decode` (data_codec_cmd.cpp)
int cmd_generate(const Args &args);

}  // namespace tessera::cli
