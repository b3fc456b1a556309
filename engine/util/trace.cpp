#include "util/trace.hpp"

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>

namespace tessera::trace {

namespace {

std::mutex g_mu;
std::vector<Event> g_events;

// One reading of both clocks, so steady-clock stamps (immune to clock
// changes mid-run) convert to wall time, which processes share.
struct Origin {
  int64_t steady = now_ns();
  int64_t wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
};
const Origin &origin() {
  static const Origin o;
  return o;
}

// Thread ids: one per stream; a loader's second and later threads get
// their own rows below the first (spans on one row must nest).
int tid_of(Stream s, int lane) {
  return 1 + static_cast<int>(s) + 10 * lane;
}

}  // namespace

const char *stream_name(Stream s) {
  switch (s) {
    case Stream::compute:
      return "compute";
    case Stream::communication:
      return "communication";
    case Stream::copy:
      return "copy";
    case Stream::offload:
      return "cpu-offload";
  }
  return "?";
}

void set_recording(bool on, int64_t step) {
  origin();  // fixed before the first stamp
  detail::step.store(on ? step : -1, std::memory_order_relaxed);
  detail::recording.store(on, std::memory_order_relaxed);
}

void set_counting_waits(bool on) {
  detail::counting.store(on, std::memory_order_relaxed);
}

void record(Event e) {
  if (e.step < 0) e.step = current_step();
  std::lock_guard<std::mutex> lk(g_mu);
  g_events.push_back(std::move(e));
}

std::vector<Event> take() {
  std::lock_guard<std::mutex> lk(g_mu);
  std::vector<Event> out;
  out.swap(g_events);
  return out;
}

int64_t wall_ns(int64_t steady_ns) {
  const Origin &o = origin();
  return o.wall + (steady_ns - o.steady);
}

std::string chrome_events(const std::vector<Event> &events, uint32_t rank, int64_t base_wall_ns) {
  using nlohmann::json;
  std::string out;
  auto add = [&](const json &j) {
    if (!out.empty()) out += ",\n";
    out += j.dump();
  };
  const int pid = static_cast<int>(rank);
  add({{"name", "process_name"},
       {"ph", "M"},
       {"pid", pid},
       {"tid", 0},
       {"args", {{"name", "rank " + std::to_string(rank)}}}});
  add({{"name", "process_sort_index"},
       {"ph", "M"},
       {"pid", pid},
       {"tid", 0},
       {"args", {{"sort_index", pid}}}});
  // Name every row in use (the four streams always, so every rank shows
  // the same tracks even where one stayed idle).
  std::vector<std::pair<Stream, int>> rows;
  for (int s = 0; s < kStreams; ++s) rows.emplace_back(static_cast<Stream>(s), 0);
  for (const auto &e : events)
    if (e.lane > 0 &&
        std::find(rows.begin(), rows.end(), std::pair(e.stream, e.lane)) == rows.end())
      rows.emplace_back(e.stream, e.lane);
  for (const auto &[s, lane] : rows) {
    std::string name = stream_name(s);
    if (lane > 0) name += " #" + std::to_string(lane + 1);
    const int tid = tid_of(s, lane);
    add({{"name", "thread_name"},
         {"ph", "M"},
         {"pid", pid},
         {"tid", tid},
         {"args", {{"name", name}}}});
    add({{"name", "thread_sort_index"},
         {"ph", "M"},
         {"pid", pid},
         {"tid", tid},
         {"args", {{"sort_index", tid}}}});
  }
  for (const auto &e : events) {
    json args = json::object();
    if (e.step >= 0) args["step"] = e.step;
    if (e.bytes >= 0) args["bytes"] = e.bytes;
    add({{"name", e.name},
         {"cat", stream_name(e.stream)},
         {"ph", "X"},
         {"pid", pid},
         {"tid", tid_of(e.stream, e.lane)},
         {"ts", static_cast<double>(wall_ns(e.begin) - base_wall_ns) / 1000.0},
         {"dur", static_cast<double>(e.end - e.begin) / 1000.0},
         {"args", args}});
  }
  return out;
}

}  // namespace tessera::trace
