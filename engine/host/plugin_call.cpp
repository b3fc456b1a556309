#include "host/plugin_call.hpp"

#include <string_view>

#include "util/error.hpp"

namespace tessera {

namespace {

// The path from the engine's folder on ("engine/train/step.cpp"): enough to
// find the line, without the build machine's directories.
std::string_view source_file(std::string_view path) {
  const size_t at = path.rfind("engine/");
  return at == std::string_view::npos ? path : path.substr(at);
}

}  // namespace

void plugin_ok(Host &host, tsr_status s, const std::string &what, std::source_location at) {
  if (s == TSR_OK) return;
  const std::string plugin_msg = host.last_error();
  host.clear_error();
  // Built by appending: GCC 12's -Wrestrict misfires on operator+ chains
  // that start from a literal.
  std::string msg = what;
  msg.append(": ").append(plugin_msg.empty() ? "failed" : plugin_msg);
  msg.append(" (").append(status_name(s));
  if (host.step() >= 0) msg.append(" at step ").append(std::to_string(host.step()));
  msg.append(", ").append(source_file(at.file_name()));
  msg.append(":").append(std::to_string(at.line())).append(")");
  throw Error(s, msg);
}

void plugin_ok(Host &host, tsr_status s, const char *section, const std::string &plugin,
               const char *call, std::source_location at) {
  if (s == TSR_OK) return;
  std::string what = "[";
  what.append(section).append("] plugin '").append(plugin).append("' ").append(call);
  plugin_ok(host, s, what, at);
}

}  // namespace tessera
