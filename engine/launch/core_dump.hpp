// Where a crashed worker's core dump went, for the launcher's report
// (docs/debugging.md, "A crashed rank").
#pragma once

#include <sys/types.h>

#include <string>

namespace tessera {

// For a worker `pid` that ended with wait status `status` in directory
// `cwd`: where its core dump was written (a file, a core_pattern handler
// such as systemd-coredump) and how to open it, or why there is none when
// the signal would have dumped core. "" when the status is no crash.
std::string core_dump_note(pid_t pid, int status, const std::string &cwd);

// The same, from an explicit kernel.core_pattern and core_uses_pid (tests).
std::string core_dump_note(pid_t pid, int status, const std::string &cwd,
                           const std::string &core_pattern, bool core_uses_pid);

}  // namespace tessera
