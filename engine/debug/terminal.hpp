// `--debug-with gdb`: gdb attached to a waiting rank, in a terminal of its
// own (a tmux window, or an X terminal).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace tessera {

// The full path of `program` on PATH ("" when it is not there).
std::string find_on_path(const std::string &program);

// Opens `gdb -p pid` in a new tmux window (inside a tmux session) or an X
// terminal (with a display). Returns true when one was opened; `note` then
// says where, otherwise why not (the caller prints attach instructions).
bool open_gdb_terminal(uint32_t rank, pid_t pid, std::string *note);

}  // namespace tessera
