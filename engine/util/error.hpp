// Engine errors: the shared Error (an exception carrying a tsr_status), and
// the bridge that records a message for the host's error callback.
#pragma once

#include <tessera/abi.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tessera/cpp/error.hpp>
#include <utility>

namespace tessera {

// The one Error of tessera's C++ code (sdk/include/tessera/cpp/error.hpp),
// the type plugins throw too, so an sdk helper's failure inside the engine
// is caught as any other. ReportedError: a failure whose message the host
// already holds, rethrown through guarded() without replacing it.
using Error = sdk::Error;
using ReportedError = sdk::HostError;

// The status code's name ("TSR_ERR_CONFIG"), for messages: a user reads
// the name, not the number.
constexpr const char *status_name(tsr_status s) {
  switch (s) {
    case TSR_OK:
      return "TSR_OK";
    case TSR_ERR_INVALID:
      return "TSR_ERR_INVALID";
    case TSR_ERR_CONFIG:
      return "TSR_ERR_CONFIG";
    case TSR_ERR_IO:
      return "TSR_ERR_IO";
    case TSR_ERR_NO_MEMORY:
      return "TSR_ERR_NO_MEMORY";
    case TSR_ERR_UNSUPPORTED:
      return "TSR_ERR_UNSUPPORTED";
    case TSR_ERR_COMM:
      return "TSR_ERR_COMM";
    case TSR_ERR_INTERNAL:
      return "TSR_ERR_INTERNAL";
    case TSR_ERR_ABORTED:
      return "TSR_ERR_ABORTED";
    default:
      return "an unknown status";
  }
}

// What a user reads of an error: `what` without the notes made for the
// engine's developers, the status name and the engine source line that
// plugin_ok and TSR_CHECK append. "[optimizer] plugin 'x' update: diverged
// (TSR_ERR_INVALID at step 12, engine/train/step.cpp:170)" reads
// "[optimizer] plugin 'x' update: diverged (at step 12)"; a TSR_CHECK's
// "(.../engine/ckpt/manifest.cpp:80)" goes. The message itself (what went
// wrong, and what to do) is the thrower's to write.
std::string user_message(std::string_view what);

// The one way an error reaches the user (the CLI's last catch, a rank's
// report of its failure, the reason the launcher and the run summary
// give): user_message(e.what()), after logging the whole text at debug
// level (--verbose shows it), where the notes help whoever debugs.
std::string error_for_user(const std::exception &e);

// Where report_error sends a message: the host (host/host.cpp) installs
// its sink when its code is linked, since only it knows what a ctx is;
// util stays below it. Without a sink, or with ctx == nullptr, the message
// is dropped.
using ErrorSink = void (*)(tsr_host_ctx *ctx, const std::string &message);
inline ErrorSink g_error_sink = nullptr;

// Records `message` as the last error of the host behind `ctx` (if any) and
// returns `code`.
inline tsr_status report_error(tsr_host_ctx *ctx, tsr_status code, const std::string &message) {
  if (ctx && g_error_sink) g_error_sink(ctx, message);
  return code;
}

// Runs fn, converting exceptions to a status reported through report_error
// (the sdk's catch-all, with the engine's own words for a foreign exception).
template <typename Fn>
tsr_status guarded(tsr_host_ctx *ctx, Fn &&fn) noexcept {
  return sdk::guard_with(
      [ctx](tsr_status code, const char *message) { return report_error(ctx, code, message); },
      sdk::GuardWords{"", "unknown exception"}, std::forward<Fn>(fn));
}

}  // namespace tessera

// Check macro for engine code: throws tessera::Error naming file and line.
#define TSR_CHECK(cond, code, msg)                                                            \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw ::tessera::Error(                                                                 \
          (code), std::string(msg) + " (" + __FILE__ + ":" + std::to_string(__LINE__) + ")"); \
  } while (0)
