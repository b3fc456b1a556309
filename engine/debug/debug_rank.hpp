// Debugging a rank of a multi-process job (docs/debugging.md): which ranks
// wait for a debugger, how long, and the job-wide suspension of timeouts.
//
// `tessera run --debug-rank R --debug-wait S --debug-with gdb` reaches the
// workers as environment variables, so a job started by another launcher
// (torchrun, mpirun) can be debugged the same way by setting them:
//   TESSERA_DEBUG_RANKS  "1", "0,3" or "all": the ranks that wait
//   TESSERA_DEBUG_WAIT   seconds to wait for a debugger; 0: until one attaches
//   TESSERA_DEBUG_WITH   "gdb": open gdb on the rank in a terminal of its own
#pragma once

#include <cstdint>
#include <set>
#include <string>

namespace tessera {

struct DebugOptions {
  bool all = false;          // every rank waits
  std::set<uint32_t> ranks;  // or these
  int64_t wait_s = 300;      // 0: wait until a debugger attaches
  std::string with;          // "" or "gdb"

  // A debug job: some rank waits for a debugger, so every rank runs
  // without collective and store timeouts.
  bool active() const { return all || !ranks.empty(); }
  bool holds(uint32_t rank) const { return all || ranks.count(rank) != 0; }
};

// What a debug job uses for comm.timeout_s: a month, "never" for a
// debugging session, yet far from overflowing any deadline arithmetic
// (Gloo adds it to steady_clock::now() in nanoseconds).
inline constexpr int64_t kDebugTimeoutS = 30LL * 24 * 3600;

// Parses --debug-rank values ("all", "1", "0,2"; repeatable) into `o`;
// throws Error with `what` in the message when one is not a rank.
void add_debug_ranks(DebugOptions &o, const std::string &value);

// Reads the TESSERA_DEBUG_* variables (inactive when unset).
DebugOptions debug_options_from_env();

// The longest a rank may wait for its debugger: a week. Beyond it the
// number is a typo (99999999999999999999 read as 292 billion years).
inline constexpr int64_t kMaxDebugWaitS = 7 * 24 * 3600;

// `text` (from `what`: "--debug-wait", "TESSERA_DEBUG_WAIT") as seconds in
// [0, kMaxDebugWaitS]; throws Error (TSR_ERR_CONFIG) naming `what` and the
// bound otherwise.
int64_t parse_debug_wait(const std::string &text, const std::string &what);
// Sets them for this process and the workers it starts.
void export_debug_options(const DebugOptions &o);

// True while a debugger (any ptrace tracer) is attached to this process.
bool debugger_attached();

// Prints this rank's PID and how to attach, optionally opens gdb on it in a
// terminal (--debug-with gdb), then waits until a debugger attaches or
// `o.wait_s` passes (then it goes on without one, saying so).
void hold_for_debugger(uint32_t rank, const DebugOptions &o);

}  // namespace tessera
