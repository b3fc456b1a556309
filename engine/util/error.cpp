#include "util/error.hpp"

#include <spdlog/spdlog.h>

#include <regex>

namespace tessera {

namespace {

// The notes plugin_ok (host/plugin_call.cpp) and TSR_CHECK append for the
// engine's developers: "(TSR_ERR_IO at step 12, engine/train/step.cpp:170)"
// and "(/path/to/engine/ckpt/manifest.cpp:80)". Nothing a user wrote has
// this shape: a status name, or a source file's name and line, alone in
// the parentheses.
const std::regex &status_note() {
  static const std::regex re(R"( \(TSR_[A-Z_]+( at step -?[0-9]+)?, [^ ()]+:[0-9]+\))");
  return re;
}
const std::regex &source_note() {
  static const std::regex re(R"( \([^ ()]*\.(cpp|hpp|cu|cuh|h):[0-9]+\))");
  return re;
}

}  // namespace

std::string user_message(std::string_view what) {
  const std::string in(what);
  std::string out;
  size_t from = 0;
  // "(TSR_ERR_IO at step 12, ...)" keeps "(at step 12)", which tells the
  // user where training stood; "(TSR_ERR_IO, ...)" goes whole.
  for (std::sregex_iterator it(in.begin(), in.end(), status_note()), end; it != end; ++it) {
    const std::smatch &m = *it;
    out.append(in, from, static_cast<size_t>(m.position(0)) - from);
    if (m[1].matched) out.append(" (").append(m[1].str().substr(1)).append(")");
    from = static_cast<size_t>(m.position(0) + m.length(0));
  }
  out.append(in, from, std::string::npos);
  return std::regex_replace(out, source_note(), "");
}

std::string error_for_user(const std::exception &e) {
  const std::string shown = user_message(e.what());
  if (shown != e.what()) spdlog::debug("error in full: {}", e.what());
  return shown;
}

}  // namespace tessera
