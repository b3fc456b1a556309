// The one error type of tessera's C++ code, shared by plugins (through
// cpp/plugin.hpp's guard) and the engine (engine/util/error.hpp): an
// exception carrying a tsr_status. Header-only; it never crosses the C ABI,
// where a status code and the host's error callback carry the failure.
#pragma once

#include <tessera/abi.h>

#include <stdexcept>
#include <string>

namespace tessera::sdk {

// An error with a status code, thrown inside a plugin or the engine and
// converted to a status at the ABI boundary (guard, the engine's guarded).
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

}  // namespace tessera::sdk
