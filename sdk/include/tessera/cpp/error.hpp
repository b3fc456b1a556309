// The one error type of tessera's C++ code, shared by plugins (through
// cpp/plugin.hpp's guard) and the engine (engine/util/error.hpp): an
// exception carrying a tsr_status. Header-only; it never crosses the C ABI,
// where a status code and the host's error callback carry the failure.
#pragma once

#include <tessera/abi.h>

#include <new>
#include <stdexcept>
#include <string>

namespace tessera::sdk {

// An error with a status code, thrown inside a plugin or the engine and
// converted to a status at the ABI boundary (guard_with below, behind
// plugin.hpp's guard and the engine's guarded).
class Error : public std::runtime_error {
 public:
  Error(tsr_status code, const std::string &message) : std::runtime_error(message), code_(code) {}
  tsr_status code() const noexcept { return code_; }

 private:
  tsr_status code_;
};

// A failure whose message the host already holds (a host call that
// failed): passed on as its status without a second message.
class HostError : public Error {
 public:
  explicit HostError(tsr_status code) : Error(code, "(reported to the host)") {}
};

// Throws HostError for a failed host call's status.
inline void check(tsr_status s) {
  if (s != TSR_OK) throw HostError(s);
}

// What a catch-all says of a failure that brings no status of its own. The
// wording is the caller's: plugins and the engine have said it differently
// since before they shared this code, and users and tests read it.
struct GuardWords {
  const char *exception_prefix;  // put before a std::exception's what()
  const char *unknown;           // for a thrown value of no std type
};

// The one catch-all at the ABI boundary: runs fn and turns whatever it
// throws into a status. A HostError passes its status on alone (its message
// is already where messages go); every other failure is handed to
// report(code, message), whose return is the status, so each side picks
// where messages go: a plugin to the host's error callback, the engine to
// its error sink.
template <typename Report, typename Fn>
tsr_status guard_with(Report &&report, const GuardWords &words, Fn &&fn) noexcept {
  try {
    fn();
    return TSR_OK;
  } catch (const HostError &e) {
    return e.code();
  } catch (const Error &e) {
    return report(e.code(), e.what());
  } catch (const std::bad_alloc &) {
    return report(TSR_ERR_NO_MEMORY, "out of host memory");
  } catch (const std::exception &e) {
    return report(TSR_ERR_INTERNAL, (std::string(words.exception_prefix) + e.what()).c_str());
  } catch (...) {
    return report(TSR_ERR_INTERNAL, words.unknown);
  }
}

}  // namespace tessera::sdk
