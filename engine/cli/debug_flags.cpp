#include "cli/debug_flags.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>

#include "debug/debug_rank.hpp"
#include "util/error.hpp"

namespace tessera::cli {

namespace {

std::string rank_list(const DebugOptions &o) {
  if (o.all) return "every rank";
  std::string s;
  for (uint32_t r : o.ranks) {
    if (!s.empty()) s += ", ";
    s += std::to_string(r);
  }
  return (o.ranks.size() == 1 ? "rank " : "ranks ") + s;
}

void check_ranks(const DebugOptions &o, uint32_t world) {
  for (uint32_t r : o.ranks)
    if (r >= world)
      throw Error(TSR_ERR_CONFIG, "--debug-rank " + std::to_string(r) + ": the job has " +
                                      std::to_string(world) + " rank" + (world == 1 ? "" : "s") +
                                      " (0.." + std::to_string(world - 1) + ")");
}

}  // namespace

std::vector<OptionSpec> debug_option_specs() {
  return {
      {"--debug-rank", true, true}, {"--debug-wait", true, false}, {"--debug-with", true, false}};
}

void export_debug_flags(const Parsed &p, int world) {
  if (!p.has("--debug-rank")) {
    if (p.has("--debug-wait") || p.has("--debug-with"))
      throw UsageError("tessera run: --debug-wait and --debug-with need --debug-rank");
    return;
  }
  DebugOptions o;
  for (const auto &v : p.all("--debug-rank")) {
    try {
      add_debug_ranks(o, v);
    } catch (const Error &e) {
      throw UsageError(std::string("tessera run: ") + e.what());
    }
  }
  if (p.has("--debug-wait")) {
    try {
      o.wait_s = parse_debug_wait(p.get("--debug-wait"), "--debug-wait");
    } catch (const Error &e) {
      throw UsageError(std::string("tessera run: ") + e.what());
    }
  }
  o.with = p.get("--debug-with");
  if (!o.with.empty() && o.with != "gdb")
    throw UsageError("tessera run: --debug-with '" + o.with + "': only 'gdb' is supported");
  if (world > 0) check_ranks(o, static_cast<uint32_t>(world));
  export_debug_options(o);
}

void start_debug_job(Job &job, uint32_t rank, uint32_t world) {
  DebugOptions o = debug_options_from_env();
  if (!o.active()) return;
  check_ranks(o, world);
  // A rank stopped in a debugger stalls every other rank in its next
  // collective, and one that waits for its debugger stalls them at the
  // rendezvous: the job trades its hang protection for being steppable.
  // (The launcher still stops every rank when one exits.)
  job.settings.comm_timeout_s = kDebugTimeoutS;
  job.settings.comm_heartbeat_timeout_s = 0;  // a rank at a breakpoint has no heartbeat
  if (rank == 0)
    spdlog::info(
        "debug job: {} wait{} for a debugger; collective and store timeouts are off, so a stuck "
        "rank stalls the job until you stop it (Ctrl-C)",
        rank_list(o), !o.all && o.ranks.size() > 1 ? "" : "s");
  if (o.holds(rank)) hold_for_debugger(rank, o);
}

}  // namespace tessera::cli
