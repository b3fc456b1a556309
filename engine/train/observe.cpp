#include "train/observe.hpp"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <type_traits>

#include "util/error.hpp"
#include "util/trace.hpp"
#include "viz/plot.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

// Every rank's `mine` (all the same length), rank after rank.
template <typename T>
std::vector<T> gather(Session &s, std::vector<T> mine, const char *what) {
  static_assert(sizeof(T) == 8);
  const uint32_t w = s.host.facts().world_size;
  std::vector<T> all(mine.size() * w);
  int64_t n_in = static_cast<int64_t>(mine.size()), n_out = static_cast<int64_t>(all.size());
  DLDataType dt =
      std::is_floating_point_v<T> ? DLDataType{kDLFloat, 64, 1} : DLDataType{kDLInt, 64, 1};
  DLTensor in{mine.data(), DLDevice{kDLCPU, 0}, 1, dt, &n_in, nullptr, 0};
  DLTensor out{all.data(), DLDevice{kDLCPU, 0}, 1, dt, &n_out, nullptr, 0};
  plugin_ok(s.host, s.host.table()->comm->all_gather(s.host.ctx(), &in, &out, nullptr), what);
  return all;
}

int64_t peak_rss() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

double model_flops_per_sample(Session &s) {
  const auto *vt = s.model.vt;
  // A plugin built against an older ABI minor may end its table earlier.
  if (vt->struct_size <
          offsetof(tsr_model_vtable, flops_per_sample) + sizeof vt->flops_per_sample ||
      !vt->flops_per_sample)
    return 0;
  return vt->flops_per_sample(s.model.self);
}

}  // namespace

std::string iso_time_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", &tm);
  return buf;
}

RunObserver::RunObserver(const Job &job, Session &s, int64_t total_steps)
    : job_(job), s_(s), started_at_(iso_time_now()) {
  const auto &st = job.settings;
  if (!st.log_trace.empty()) {
    // Default window: five steps after the first, which pays for lazy
    // allocation and warm caches and so is not typical.
    trace_first_ = st.trace_first > 0 ? st.trace_first : std::min<int64_t>(2, total_steps);
    trace_last_ = st.trace_first > 0 ? st.trace_last : 6;
    trace_last_ = std::min(trace_last_, total_steps);
    if (trace_first_ > trace_last_) {
      spdlog::warn("log.trace_steps starts at step {} but the run has {} steps; tracing none",
                   trace_first_, total_steps);
      trace_first_ = trace_last_ = 0;
    }
  }
}

RunObserver::~RunObserver() {
  trace::set_recording(false, -1);
}

void RunObserver::begin_step(int64_t step) {
  if (trace_first_ == 0) return;
  trace::set_recording(step >= trace_first_ && step <= trace_last_, step);
}

nlohmann::json RunObserver::at_log(int64_t steps) {
  MemoryStats m = s_.host.memory();
  nlohmann::json extra = {{"memory_bytes", m.current_total}, {"peak_memory_bytes", m.peak_total}};
  nlohmann::json b = breakdown_.take_interval(steps);
  nlohmann::json off = offload_interval();
  if (job_.settings.log_breakdown) {
    if (!off.is_null()) b["offload"] = std::move(off);
    extra["breakdown"] = std::move(b);
  }
  return extra;
}

nlohmann::json RunObserver::offload_interval() {
  // An offloaded update overlaps the step, so its parts are not slices of
  // the step's time: the backend's own seconds (copies, the host step, a
  // device share) and how long the next forward waited for it.
  const auto *vt = s_.offload.vt;
  if (!vt || !s_.offload.caps.offload.stats) return nullptr;
  tsr_offload_stats now{};
  now.struct_size = tsr_offload_stats_STRUCT_SIZE;
  if (vt->stats(s_.offload.self, &now) != TSR_OK) {
    s_.host.clear_error();
    return nullptr;
  }
  nlohmann::json j = {{"d2h", now.d2h_s - offload_last_.d2h_s},
                      {"cpu_step", now.host_s - offload_last_.host_s},
                      {"h2d", now.h2d_s - offload_last_.h2d_s},
                      {"device_share", now.device_s - offload_last_.device_s},
                      {"wait", s_.flight.wait_s - wait_last_},
                      {"ranges_in_backward", s_.flight.ranges_in_backward - early_last_}};
  offload_last_ = now;
  wait_last_ = s_.flight.wait_s;
  early_last_ = s_.flight.ranges_in_backward;
  // The GPU's side (CUDA): the stream's time over the passes and at the
  // waits for the update, from its own events (the spans it has finished).
  if (s_.flight.gpu_passes) j["gpu_passes"] = s_.flight.gpu_passes->take();
  if (s_.flight.gpu_waits) j["gpu_waited"] = s_.flight.gpu_waits->take();
  if (const auto *sp = s_.offload.caps.offload.speculate) {
    // Speculation (ABI 1.7): how often a step stepped ahead of the norm was
    // redone or undone, and what keeping and redoing cost.
    tsr_speculate_stats sn{};
    sn.struct_size = tsr_speculate_stats_STRUCT_SIZE;
    if (sp->stats(s_.offload.self, &sn) != TSR_OK) {
      s_.host.clear_error();
      return j;
    }
    const tsr_speculate_stats &o = spec_last_;
    j["speculated_steps"] = sn.steps - o.steps;
    j["redone_steps"] = sn.redone - o.redone;
    j["restored_steps"] = sn.restored - o.restored;
    j["redone_elements"] = sn.elements_redone - o.elements_redone;
    j["speculation_save"] = sn.save_s - o.save_s;
    j["redo"] = sn.redo_s - o.redo_s;
    j["held_for_norm"] = sn.held_s - o.held_s;
    spec_last_ = sn;
  }
  return j;
}

nlohmann::json RunObserver::gather_memory() {
  MemoryStats m = s_.host.memory();
  std::vector<int64_t> mine;
  for (size_t p = 0; p < TSR_MEM_PURPOSE_COUNT; ++p)
    mine.push_back(static_cast<int64_t>(m.peak[p]));
  mine.push_back(static_cast<int64_t>(m.peak_total));
  mine.push_back(peak_rss());
  const size_t n = mine.size();
  std::vector<int64_t> all = gather(s_, std::move(mine), "gather peak memory");
  nlohmann::json by_rank = nlohmann::json::array();
  for (uint32_t r = 0; r < s_.host.facts().world_size; ++r) {
    const int64_t *x = &all[r * n];
    nlohmann::json j = {{"rank", r}};
    for (int p = 0; p < TSR_MEM_PURPOSE_COUNT; ++p)
      j[purpose_name(static_cast<tsr_mem_purpose>(p))] = x[p];
    j["total"] = x[TSR_MEM_PURPOSE_COUNT];
    j["rss"] = x[TSR_MEM_PURPOSE_COUNT + 1];
    by_rank.push_back(std::move(j));
  }
  return by_rank;
}

nlohmann::json RunObserver::gather_breakdown(nlohmann::json &rank0) {
  std::vector<double> mine(breakdown_.totals().begin(), breakdown_.totals().end());
  mine.push_back(breakdown_.wall());
  const size_t n = mine.size();
  std::vector<double> all = gather(s_, std::move(mine), "gather time breakdown");
  nlohmann::json by_rank = nlohmann::json::array();
  for (uint32_t r = 0; r < s_.host.facts().world_size; ++r) {
    const double *x = &all[r * n];
    nlohmann::json j = {{"rank", r}};
    double sum = 0;
    for (int p = 0; p < kParts; ++p) {
      j[part_key(static_cast<Part>(p))] = x[p];
      sum += x[p];
    }
    j["other"] = x[kParts] - sum;
    j["total"] = x[kParts];
    by_rank.push_back(j);
    if (r == 0) {
      rank0 = j;
      rank0.erase("rank");
    }
  }
  return by_rank;
}

// Each rank's events travel to rank 0 through the collectives rather than
// through per-rank files: ranks on other nodes need not share a
// filesystem, and no part files are left behind when a rank dies.
std::string RunObserver::write_trace() {
  trace::set_recording(false, -1);
  const auto &f = s_.host.facts();
  std::vector<trace::Event> events = trace::take();
  int64_t first = INT64_MAX;
  for (const auto &e : events) first = std::min(first, trace::wall_ns(e.begin));
  std::vector<int64_t> firsts = gather(s_, std::vector<int64_t>{first}, "gather trace start");
  int64_t base = *std::min_element(firsts.begin(), firsts.end());
  if (base == INT64_MAX) base = 0;
  std::string mine = trace::chrome_events(events, f.rank, base);
  std::vector<int64_t> sizes = gather(
      s_,
      std::vector<int64_t>{static_cast<int64_t>(mine.size()), static_cast<int64_t>(events.size())},
      "gather trace sizes");
  int64_t longest = 0, spans = 0;
  for (uint32_t r = 0; r < f.world_size; ++r) {
    longest = std::max(longest, sizes[2 * r]);
    spans += sizes[2 * r + 1];
  }
  const size_t words = static_cast<size_t>(longest + 7) / 8 + 1;
  std::vector<int64_t> packed(words, 0);
  std::memcpy(packed.data(), mine.data(), mine.size());
  std::vector<int64_t> all = gather(s_, std::move(packed), "gather trace events");
  const std::string &path = job_.settings.log_trace;
  if (f.rank != 0) return path;

  std::error_code ec;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw Error(TSR_ERR_IO, path + ": cannot write the trace (log.trace)");
  out << "{\"traceEvents\": [\n";
  for (uint32_t r = 0; r < f.world_size; ++r) {
    const char *text = reinterpret_cast<const char *>(&all[r * words]);
    if (r) out << ",\n";
    out.write(text, static_cast<std::streamsize>(sizes[2 * r]));
  }
  nlohmann::json other = {
      {"run", job_.settings.name},
      {"steps", std::to_string(trace_first_) + "-" + std::to_string(trace_last_)},
      {"world_size", f.world_size},
      {"clock", "wall-clock microseconds since the first span of any rank"},
      {"tracks", "pid = rank; tid = compute, communication, copy, cpu-offload"}};
  out << "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": " << other.dump() << "}\n";
  if (!out) throw Error(TSR_ERR_IO, path + ": write failed");
  std::printf(
      "tessera: trace of steps %lld-%lld (%u ranks, %lld spans) written to %s "
      "(open it in ui.perfetto.dev or chrome://tracing)\n",
      static_cast<long long>(trace_first_), static_cast<long long>(trace_last_), f.world_size,
      static_cast<long long>(spans), path.c_str());
  return path;
}

// The plot is a convenience: failing to draw it never fails the run.
std::string RunObserver::write_plot() {
  const std::string path = job_.settings.dir + "/plot.svg";
  try {
    viz::write_plot({viz::load_run_metrics(job_.settings.dir)}, path);
    return path;
  } catch (const std::exception &e) {
    spdlog::warn("could not write {}: {}", path, e.what());
    return "";
  }
}

void RunObserver::finish(nlohmann::json &summary) {
  const auto &st = job_.settings;
  const auto &f = s_.host.facts();
  nlohmann::json breakdown;
  summary["time_breakdown_by_rank"] = gather_breakdown(breakdown);
  summary["time_breakdown"] = breakdown;
  summary["peak_memory_by_rank"] = gather_memory();
  if (const auto *sp = s_.offload.caps.offload.speculate) {
    // This rank's speculation over the run (ABI 1.7; the breakdown has it
    // per interval): steps stepped ahead of the norm, how many were redone
    // or undone, and the seconds keeping and redoing took.
    tsr_speculate_stats t{};
    t.struct_size = tsr_speculate_stats_STRUCT_SIZE;
    if (sp->stats(s_.offload.self, &t) == TSR_OK)
      summary["offload_speculation"] = {
          {"speculated_steps", t.steps},  {"redone_steps", t.redone},
          {"restored_steps", t.restored}, {"redone_elements", t.elements_redone},
          {"save_s", t.save_s},           {"redo_s", t.redo_s},
          {"held_for_norm_s", t.held_s}};
    else
      s_.host.clear_error();
  }
  std::string trace_path = trace_first_ > 0 ? write_trace() : "";

  // Achieved FLOP/s from the model's own count; MFU needs the device's peak.
  const double fps = model_flops_per_sample(s_);
  const double samples = summary.value("samples", 0.0), train_s = summary.value("train_s", 0.0);
  const double job_flops = fps > 0 && train_s > 0 ? fps * samples / train_s : 0;
  const double rank_flops = job_flops / f.world_size;
  summary["flops_per_sample"] = fps > 0 ? nlohmann::json(fps) : nlohmann::json(nullptr);
  summary["flops_per_s"] = fps > 0 ? nlohmann::json(job_flops) : nlohmann::json(nullptr);
  summary["flops_per_s_per_rank"] = fps > 0 ? nlohmann::json(rank_flops) : nlohmann::json(nullptr);
  summary["peak_tflops"] =
      st.peak_tflops > 0 ? nlohmann::json(st.peak_tflops) : nlohmann::json(nullptr);
  summary["mfu"] = fps > 0 && st.peak_tflops > 0
                       ? nlohmann::json(rank_flops / (st.peak_tflops * 1e12))
                       : nlohmann::json(nullptr);
  summary["started_at"] = started_at_;
  summary["finished_at"] = iso_time_now();

  std::string plot = f.rank == 0 && st.log_plot ? write_plot() : "";
  auto or_null = [](const std::string &p) {
    return p.empty() ? nlohmann::json(nullptr) : nlohmann::json(p);
  };
  summary["files"] = {
      {"run_dir", st.dir},
      {"summary", st.dir + "/summary.json"},
      {"metrics", st.dir + "/metrics.jsonl"},
      {"config", st.dir + "/config.toml"},
      {"plot", or_null(plot)},
      {"trace", or_null(trace_path)},
      {"checkpoint", summary.value("checkpoint", nlohmann::json(nullptr))},
  };
}

}  // namespace tessera
