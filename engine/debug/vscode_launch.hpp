// The VS Code launch.json that `tessera debug vscode` writes: the text of
// docs/vscode/launch.json, compiled in (engine/CMakeLists.txt) so that an
// installed binary needs no source tree.
#pragma once

namespace tessera {

const char *vscode_launch_json();

// Where the file names the tessera binary; `tessera debug vscode` puts its
// own path there.
inline constexpr const char *kVscodeProgramPlaceholder =
    "${workspaceFolder}/build-debug/bin/tessera";

}  // namespace tessera
