// What a run records about itself: the [log] section's resolution, the
// time breakdown's accounting of waits, the trace's Chrome events, and the
// plot's SVG for hand-made metrics.
#include <catch2/catch.hpp>
#include <climits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "config/config.hpp"
#include "config/settings.hpp"
#include "train/breakdown.hpp"
#include "util/trace.hpp"
#include "viz/plot.hpp"
#include "viz/svg.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace unit_test_observe {

namespace {

using tessera::config::ConfigError;
using tessera::config::Document;
using tessera::config::Settings;

Settings settings_of(const std::string &log_section, toml::table *resolved = nullptr) {
  Document d = Document::from_string(
      "[run]\nsteps = 10\ndir = \"runs/x\"\n[batch]\nmicro = 4\n" + log_section, "log.toml");
  return tessera::config::resolve_settings(d, 1, resolved);
}

std::string error_of(const std::string &log_section) {
  try {
    settings_of(log_section);
  } catch (const ConfigError &e) {
    return e.what();
  }
  FAIL("expected a ConfigError");
  return "";
}

void busy_for(int64_t ns) {
  const int64_t until = tessera::trace::now_ns() + ns;
  while (tessera::trace::now_ns() < until) {
  }
}

}  // namespace

TEST_CASE("[log] resolves its defaults, the trace path and the step window", "[config][log]") {
  Settings s = settings_of("");
  CHECK_FALSE(s.log_breakdown);
  CHECK(s.log_plot);
  CHECK(s.log_trace.empty());
  CHECK(s.trace_first == 0);
  CHECK(s.peak_tflops == 0);

  toml::table resolved;
  s = settings_of(
      "[log]\nbreakdown = true\ntrace = \"t.json\"\ntrace_steps = \"3-7\"\n"
      "plot = false\npeak_tflops = 19.5\n",
      &resolved);
  CHECK(s.log_breakdown);
  CHECK_FALSE(s.log_plot);
  // Relative to the run directory, and the resolved config says so.
  CHECK(s.log_trace == "runs/x/t.json");
  CHECK(resolved["log"]["trace"].value_or(std::string()) == "runs/x/t.json");
  CHECK(s.trace_first == 3);
  CHECK(s.trace_last == 7);
  CHECK(s.peak_tflops == 19.5);

  CHECK(settings_of("[log]\ntrace = \"/tmp/abs.json\"\n").log_trace == "/tmp/abs.json");
  s = settings_of("[log]\ntrace_steps = \"4\"\n");
  CHECK((s.trace_first == 4 && s.trace_last == 4));
  s = settings_of("[log]\ntrace_steps = \"all\"\n");
  CHECK((s.trace_first == 1 && s.trace_last == INT64_MAX));
  // A number is taken where a number is meant, and a bad one named.
  s = settings_of("[log]\ntrace_steps = 4\n");
  CHECK((s.trace_first == 4 && s.trace_last == 4));
  CHECK_THAT(error_of("[log]\ntrace_steps = 0\n"),
             Catch::Contains("log.trace_steps: must be >= 1"));
  CHECK_THAT(error_of("[log]\ntrace_steps = 2.5\n"), Catch::Contains("log.trace_steps"));
  CHECK_THAT(error_of("[log]\ntrace_steps = true\n"), Catch::Contains("log.trace_steps"));

  for (const char *bad : {"7-3", "0-2", "x", "3-", "-3", "2-4-6", "1.5"}) {
    INFO(bad);
    std::string msg = error_of(std::string("[log]\ntrace_steps = \"") + bad + "\"\n");
    CHECK_THAT(msg, Catch::Contains("log.toml:"));
    CHECK_THAT(msg, Catch::Contains("log.trace_steps"));
  }
  CHECK_THAT(error_of("[log]\nbreakdwon = true\n"), Catch::Contains("breakdown"));
  CHECK_THAT(error_of("[log]\npeak_tflops = -1.0\n"), Catch::Contains("peak_tflops"));
}

TEST_CASE("the breakdown moves time blocked on collectives into comm_wait", "[observe]") {
  using tessera::Breakdown;
  using tessera::Part;
  namespace trace = tessera::trace;
  Breakdown b;
  CHECK(trace::counting_waits());
  b.restart_interval();
  {
    auto fwd = b.time(Part::forward, "forward");
    busy_for(3'000'000);
    trace::add_wait(1'000'000);  // as GlooComm::wait does after blocking
  }
  {
    auto ev = b.time(Part::eval, "eval");  // eval keeps its collectives
    busy_for(1'000'000);
    trace::add_wait(500'000);
  }
  trace::add_wait(2'000'000);  // outside every scope: a loss average
  busy_for(2'000'000);
  nlohmann::json j = b.take_interval(1);
  INFO(j.dump());
  const double forward = j["forward"].get<double>();
  CHECK(forward >= 0.0019);  // 3 ms less the 1 ms blocked
  CHECK(j["comm_wait"].get<double>() == Approx(0.003).epsilon(1e-6));
  CHECK(j["eval"].get<double>() >= 0.00095);
  CHECK(j["steps"] == 1);
  double sum = 0;
  for (int p = 0; p < tessera::kParts; ++p)
    sum += j[tessera::part_key(static_cast<Part>(p))].get<double>();
  CHECK(j["other"].get<double>() == Approx(j["total"].get<double>() - sum));
  // Totals carry the same; a new interval starts from zero.
  CHECK(b.totals()[static_cast<size_t>(Part::comm_wait)] == Approx(0.003).epsilon(1e-6));
  nlohmann::json next = b.take_interval(0);
  CHECK(next["forward"] == 0.0);
  CHECK(next["comm_wait"] == 0.0);
}

TEST_CASE("trace spans become Chrome events per rank and stream", "[observe][trace]") {
  namespace trace = tessera::trace;
  trace::take();
  { trace::Span off(trace::Stream::copy, "not recorded"); }
  trace::set_recording(true, 7);
  { trace::Span s(trace::Stream::communication, "all_reduce", 4096); }
  std::thread([] { trace::Span s(trace::Stream::copy, "load batch", -1, 1); }).join();
  trace::record(trace::Event{"forward", trace::Stream::compute, 0, trace::now_ns(),
                             trace::now_ns() + 1000, -1, -1});
  trace::set_recording(false, 8);
  std::vector<trace::Event> ev = trace::take();
  REQUIRE(ev.size() == 3);
  int64_t base = trace::wall_ns(ev[0].begin);
  std::string text = trace::chrome_events(ev, 3, base);
  nlohmann::json events = nlohmann::json::parse("[" + text + "]");
  std::map<int, std::string> rows;
  int spans = 0;
  for (const auto &e : events) {
    CHECK(e["pid"] == 3);
    if (e["ph"] == "M" && e["name"] == "thread_name")
      rows[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
    if (e["ph"] != "X") continue;
    ++spans;
    CHECK(e["args"]["step"] == 7);
    CHECK(e["ts"].get<double>() >= 0);
    CHECK(e["dur"].get<double>() >= 0);
    if (e["name"] == "all_reduce") CHECK(e["args"]["bytes"] == 4096);
    CHECK(rows.count(e["tid"].get<int>()) == 1);
  }
  CHECK(spans == 3);
  std::set<std::string> names;
  for (const auto &[tid, name] : rows) names.insert(name);
  CHECK(names ==
        std::set<std::string>{"compute", "communication", "copy", "cpu-offload", "copy #2"});
}

TEST_CASE("the plot draws each series of each run, escaped", "[observe][plot]") {
  tessera::viz::RunMetrics a{"a<&>", "runs/a", {}, 0}, b{"b", "runs/b", {}, 0};
  for (int step = 10; step <= 50; step += 10) {
    a.lines.push_back({{"type", "train"},
                       {"step", step},
                       {"loss", 1.0 / step},
                       {"lr", 0.1},
                       {"samples_per_s", 100.0},
                       {"loss_scale", 65536.0}});
    b.lines.push_back({{"type", "train"},
                       {"step", step},
                       {"loss", 2.0 / step},
                       {"lr", 0.2},
                       {"samples_per_s", 50.0}});
  }
  a.lines.push_back({{"type", "eval"}, {"step", 50}, {"eval_loss", 0.5}});
  std::string svg = tessera::viz::render_plot({a, b});
  auto count = [&](const std::string &needle) {
    size_t n = 0;
    for (size_t at = svg.find(needle); at != std::string::npos; at = svg.find(needle, at + 1)) ++n;
    return n;
  };
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(count("<polyline") == count("data-series="));
  CHECK(count("data-run=\"a&lt;&amp;&gt;\"") ==
        6);  // train, eval, lr, throughput, loss scale + legend
  CHECK(count("data-series=\"loss scale\"") == 1);  // only run a has one
  CHECK(count("data-series=\"train loss\"") == 2);
  CHECK(count("data-series=\"memory\"") == 0);  // no memory in these lines: no panel
  CHECK(svg.find("a<&>") == std::string::npos);
  CHECK(tessera::viz::xml_escape("\"'<>&\x01") == "&quot;&apos;&lt;&gt;&amp; ");
  CHECK(tessera::viz::coord(12.5) == "12.5");
  CHECK(tessera::viz::coord(-0.001) == "0");
}

TEST_CASE("run.max_gpu_memory takes bytes as a number or a size with its unit", "[observe]") {
  auto cap_of = [](const std::string &value) {
    Document d = Document::from_string(
        "[run]\nsteps = 10\nmax_gpu_memory = " + value + "\n[batch]\nmicro = 4\n", "cap.toml");
    return tessera::config::resolve_settings(d, 1, nullptr).max_gpu_memory;
  };
  auto error_for = [&](const std::string &value) -> std::string {
    try {
      cap_of(value);
    } catch (const ConfigError &e) {
      return e.what();
    }
    FAIL("expected a ConfigError for " << value);
    return "";
  };
  CHECK(cap_of("1073741824") == (1ull << 30));
  CHECK(cap_of("\"1GiB\"") == (1ull << 30));
  CHECK(cap_of("\"500MB\"") == 500'000'000ull);
  CHECK(cap_of("\"\"") == 0);
  CHECK_THAT(error_for("-1"), Catch::Contains("run.max_gpu_memory: must be >= 0"));
  CHECK_THAT(error_for("\"lots\""), Catch::Contains("run.max_gpu_memory"));
  CHECK_THAT(error_for("true"), Catch::Contains("run.max_gpu_memory"));
}

}  // namespace unit_test_observe
