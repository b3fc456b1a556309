// Loading a library runs its code (static initialisers, then the entry
// function) before any check can see it: each candidate is first loaded in
// a child process, so that one that crashes, exits or hangs there is
// refused with its file named instead of taking every run down, whether or
// not the run uses it (docs/security.md, "Plugins: where code loads from").
//
// The children run side by side under one deadline (10 s for all of them:
// five libraries that hang cost 10 s, not 50), and each verdict is kept in
// this process's environment (TESSERA_PLUGIN_PROBES), keyed by the file's
// identity (device, inode, size, modification and change times): the
// workers a launcher starts inherit it and probe none of the files the
// launcher probed, so a library is probed once per launch. A file changed
// since is a new identity, and probed again.
#pragma once

#include <string>
#include <vector>

namespace tessera {

// The one deadline of a round of probes, in milliseconds.
inline constexpr int kProbeDeadlineMs = 10000;

// For each of `paths`, "" when the library loaded in a child process (or
// could not be probed: fork failed; the caller then loads it as before),
// else why it is refused, naming the file.
std::vector<std::string> probe_libraries(const std::vector<std::string> &paths);

}  // namespace tessera
