// The engine's side of a plugin call that failed: one Error naming what was
// called (the section, the plugin and the call), the plugin's own message,
// the status by name, the training step and the engine line that called.
#pragma once

#include <tessera/abi.h>

#include <source_location>
#include <string>

#include "host/host.hpp"

namespace tessera {

// Throws Error when `s` is not TSR_OK: "<what>: <the plugin's message>
// (TSR_ERR_IO at step 12, engine/train/step.cpp:170)". `what` names the
// call, e.g. "[model] plugin 'gpt2' forward".
void plugin_ok(Host &host, tsr_status s, const std::string &what,
               std::source_location at = std::source_location::current());

// The same for a call of plugin `plugin` in [section]: names all three.
void plugin_ok(Host &host, tsr_status s, const char *section, const std::string &plugin,
               const char *call, std::source_location at = std::source_location::current());

}  // namespace tessera
