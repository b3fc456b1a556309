// Seeing a run: the plot (SVG from real metrics.jsonl, several runs
// overlaid), the time breakdown (parts sum to the step time), the Chrome
// trace of a 2-rank CPU job (every rank and stream), the run report in
// summary.json and on stdout, and `tessera runs`.
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <set>

#include "harness.hpp"

// Its own namespace: in a unity batch (TESSERA_UNITY_BUILD) this file's
// helpers and using-directives stay out of the other files' way.
namespace itest_test_viz {

using namespace tessera::itest;
using nlohmann::json;

namespace {

RunResult run_ok(const fs::path &config, std::vector<std::string> args = {},
                 const RunOptions &opts = {}) {
  args.insert(args.begin(), {"run", config.string()});
  RunResult r = run_cli(args, opts);
  INFO(describe(r));
  REQUIRE(r.status == 0);
  return r;
}

// One element of an SVG: its tag name and attributes.
struct Element {
  std::string tag;
  std::map<std::string, std::string> attrs;
  std::string text;  // character data up to the next tag
};

// A small XML reader for the plots: checks that tags nest and close, and
// returns every element in document order. Enough for the writer's
// output, which uses no CDATA, comments or entities beyond the five.
std::vector<Element> parse_svg(const std::string &doc) {
  std::vector<Element> out;
  std::vector<std::string> open;
  size_t i = 0;
  while ((i = doc.find('<', i)) != std::string::npos) {
    size_t end = doc.find('>', i);
    REQUIRE(end != std::string::npos);
    std::string tag = doc.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty() || tag[0] == '?' || tag[0] == '!') continue;
    if (tag[0] == '/') {
      REQUIRE(!open.empty());
      CHECK(open.back() == tag.substr(1));
      open.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    if (self_closing) tag.pop_back();
    Element e;
    size_t sp = tag.find_first_of(" \n");
    e.tag = tag.substr(0, sp);
    // name="value" pairs; values never hold a quote (escaped as &quot;).
    size_t at = sp;
    while (at != std::string::npos && at < tag.size()) {
      size_t eq = tag.find("=\"", at);
      if (eq == std::string::npos) break;
      size_t name_start = tag.find_last_of(" \n", eq) + 1;
      size_t close = tag.find('"', eq + 2);
      REQUIRE(close != std::string::npos);
      e.attrs[tag.substr(name_start, eq - name_start)] = tag.substr(eq + 2, close - eq - 2);
      at = close + 1;
    }
    size_t next = doc.find('<', i);
    e.text = doc.substr(i, next == std::string::npos ? std::string::npos : next - i);
    out.push_back(e);
    if (!self_closing) open.push_back(e.tag);
  }
  CHECK(open.empty());
  return out;
}

// The series polylines, keyed "run/series".
std::map<std::string, Element> series_of(const std::vector<Element> &svg) {
  std::map<std::string, Element> m;
  for (const auto &e : svg)
    if (e.tag == "polyline" && e.attrs.count("data-series"))
      m[e.attrs.at("data-run") + "/" + e.attrs.at("data-series")] = e;
  return m;
}

std::set<std::string> legend_texts(const std::vector<Element> &svg) {
  std::set<std::string> s;
  for (const auto &e : svg)
    if (e.tag == "text" && e.attrs.count("class") && e.attrs.at("class") == "legend")
      s.insert(e.text);
  return s;
}

size_t point_count(const Element &polyline) {
  std::string pts = polyline.attrs.at("points");
  size_t n = pts.empty() ? 0 : 1;
  for (char c : pts) n += c == ' ';
  return n;
}

}  // namespace

TEST_CASE("plot renders a run's metrics as SVG with every series, and overlays runs", "[viz]") {
  Setup s = setup();
  RunResult r = run_ok(s.config, {"--set", "run.eval_every=20"});
  // The run drew its own plot, and says where it is.
  CHECK(fs::exists(s.run_dir / "plot.svg"));
  CHECK(contains(r.out, "plot             " + (s.run_dir / "plot.svg").string()));

  const fs::path out = scratch() / "one.svg";
  RunResult p = run_cli({"plot", s.run_dir.string(), "-o", out.string()});
  INFO(describe(p));
  REQUIRE(p.status == 0);
  std::vector<Element> svg = parse_svg(read_text(out));
  REQUIRE(!svg.empty());
  CHECK(svg.front().tag == "svg");
  auto series = series_of(svg);
  // Six logged intervals (steps 10..60), three evaluations (20, 40, 60).
  const std::map<std::string, size_t> expect = {{"run/train loss", 6},    {"run/eval loss", 3},
                                                {"run/eval accuracy", 3}, {"run/lr", 6},
                                                {"run/samples/s", 6},     {"run/memory", 6}};
  for (const auto &[key, n] : expect) {
    INFO(key);
    REQUIRE(series.count(key) == 1);
    CHECK(point_count(series[key]) == n);
    CHECK(series[key].attrs.at("data-points") == std::to_string(n));
  }
  CHECK(series.count("run/loss scale") == 0);  // fp32: no loss scale panel
  CHECK(series.size() == expect.size());
  auto legend = legend_texts(svg);
  CHECK(legend.count("run") == 1);
  CHECK(legend.count("train loss") == 1);
  CHECK(legend.count("eval loss") == 1);
  // Points lie inside the drawing.
  for (const auto &[key, e] : series) {
    std::string pts = e.attrs.at("points");
    for (char c : pts)
      CHECK((std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == ',' || c == ' '));
  }

  // A second run (another learning rate) overlays the first.
  const fs::path other = scratch() / "slow";
  run_ok(s.config, {"--set", "run.dir=" + other.string(), "--set", "optimizer.lr=0.002", "--set",
                    "run.eval_every=20", "--set", "log.plot=false"});
  CHECK_FALSE(fs::exists(other / "plot.svg"));
  const fs::path both = scratch() / "both.svg";
  p = run_cli({"plot", s.run_dir.string(), other.string(), "-o", both.string()});
  INFO(describe(p));
  REQUIRE(p.status == 0);
  svg = parse_svg(read_text(both));
  series = series_of(svg);
  for (const char *run : {"run", "slow"})
    for (const char *name : {"train loss", "eval loss", "lr", "samples/s", "memory"}) {
      INFO(run << "/" << name);
      CHECK(series.count(std::string(run) + "/" + name) == 1);
    }
  legend = legend_texts(svg);
  CHECK(legend.count("run") == 1);
  CHECK(legend.count("slow") == 1);
  // Each run has its own colour.
  CHECK(series["run/train loss"].attrs.at("stroke") !=
        series["slow/train loss"].attrs.at("stroke"));

  // PNG where a converter works; otherwise a clear message and the SVG.
  const fs::path png = scratch() / "one.png";
  RunResult q = run_cli({"plot", s.run_dir.string(), "-o", png.string()});
  INFO(describe(q));
  if (q.status == 0) {
    std::string head = read_text(png).substr(0, 8);
    CHECK(head == "\x89PNG\r\n\x1a\n");
  } else {
    CHECK(q.status == 1);
    CHECK(contains(q.err, "rsvg-convert"));
    CHECK(fs::exists(scratch() / "one.svg"));
  }

  // Usage errors.
  CHECK(run_cli({"plot"}).status == 2);
  CHECK(run_cli({"plot", s.run_dir.string(), "-o", "x.pdf"}).status == 2);
  RunResult missing = run_cli({"plot", (scratch() / "nope").string()});
  CHECK(missing.status == 1);
  CHECK(contains(missing.err, "metrics.jsonl"));
}

TEST_CASE("the time breakdown's parts sum to within 5% of the step time", "[viz][breakdown]") {
  // A wider model, so that a step (a few ms) is long against the clock's
  // resolution and the loop's own bookkeeping between the parts, which a
  // loaded machine stretches (CI under two busy processes).
  Setup s = setup("[log]\nbreakdown = true\npeak_tflops = 0.5\n");
  RunResult r = run_ok(s.config, {"--set", "model.hidden=[512, 512]", "--set",
                                  "checkpoint.every=30", "--set", "run.eval_every=30"});
  int with_breakdown = 0;
  for (const auto &m : read_jsonl(s.run_dir / "metrics.jsonl")) {
    if (m.value("type", "") != "train") continue;
    INFO(m.dump());
    REQUIRE(m.contains("breakdown"));
    const json &b = m["breakdown"];
    const double total = b.at("total").get<double>();
    REQUIRE(total > 0);
    double sum = 0;
    for (const char *k :
         {"data", "forward", "backward", "comm_wait", "optimizer", "checkpoint", "eval"}) {
      CHECK(b.at(k).get<double>() >= 0);
      sum += b.at(k).get<double>();
    }
    // 5%, and 3 ms: on a run of a few ms per interval (sanitizer builds,
    // a loaded machine) the loop's own bookkeeping is more than 5%.
    CHECK(std::abs(sum - total) <= 0.05 * total + 0.003);
    CHECK(b.at("other").get<double>() == Approx(total - sum).margin(1e-9));
    CHECK(b.at("forward").get<double>() > 0);
    CHECK(b.at("backward").get<double>() > 0);
    CHECK(b.at("steps").get<int64_t>() == 10);
    CHECK(m.at("memory_bytes").get<double>() > 0);
    ++with_breakdown;
  }
  CHECK(with_breakdown == 6);
  // Compact in the progress line.
  int lines_with = 0;
  for (const auto &line : lines(r.out))
    if (line.rfind("step", 0) == 0 && contains(line, "ms/step:") && contains(line, " fwd ") &&
        contains(line, " bwd ") && contains(line, " comm ") && contains(line, " opt "))
      ++lines_with;
  CHECK(lines_with == 6);

  // The run report: totals, FLOP/s and MFU against the configured peak.
  json sum = read_json(s.run_dir / "summary.json");
  INFO(sum.dump(2));
  const json &tb = sum.at("time_breakdown");
  double parts = 0;
  for (const char *k :
       {"data", "forward", "backward", "comm_wait", "optimizer", "checkpoint", "eval"})
    parts += tb.at(k).get<double>();
  // The run's total holds every interval's bookkeeping: 3 ms for each.
  CHECK(std::abs(parts - tb.at("total").get<double>()) <=
        0.05 * tb.at("total").get<double>() + 0.003 * with_breakdown);
  CHECK(tb.at("checkpoint").get<double>() > 0);
  CHECK(tb.at("eval").get<double>() > 0);
  CHECK(sum.at("flops_per_sample").get<double>() > 0);
  CHECK(sum.at("flops_per_s").get<double>() > 0);
  const double mfu = sum.at("mfu").get<double>();
  CHECK(mfu == Approx(sum["flops_per_s_per_rank"].get<double>() / 0.5e12));
  REQUIRE(sum.at("peak_memory_by_rank").size() == 1);
  CHECK(sum["peak_memory_by_rank"][0].at("parameters").get<double>() > 0);
  CHECK(sum["peak_memory_by_rank"][0].at("optimizer state").get<double>() > 0);
  CHECK(sum.at("files").at("plot").get<std::string>() == (s.run_dir / "plot.svg").string());
  CHECK(sum["files"].at("trace").is_null());
  CHECK(contains(r.out, "MFU"));
  CHECK(contains(r.out, "time (rank 0)"));
  CHECK(contains(r.out, "summary          " + (s.run_dir / "summary.json").string()));

  // Without a configured peak there is no MFU, and the summary says how.
  Setup t = setup("", "nopeak");
  RunResult u = run_ok(t.config);
  json sum2 = read_json(t.run_dir / "summary.json");
  CHECK(sum2.at("mfu").is_null());
  CHECK(contains(u.out, "set log.peak_tflops"));
  for (const auto &m : read_jsonl(t.run_dir / "metrics.jsonl"))
    CHECK_FALSE(m.contains("breakdown"));

  // DeepSpeed's wall_clock_breakdown turns it on.
  write_text(scratch() / "ds.json", "{\"wall_clock_breakdown\": true}");
  RunResult c = run_cli({"config", "check", t.config.string(), "--deepspeed_config",
                         (scratch() / "ds.json").string()});
  INFO(describe(c));
  REQUIRE(c.status == 0);
  CHECK(contains(c.out, "[log]"));
  CHECK(contains(c.out, "breakdown = true"));
}

TEST_CASE("the trace of a 2-rank CPU run has spans for every rank and stream", "[viz][trace]") {
  Setup s = setup("[log]\ntrace = \"trace.json\"\ntrace_steps = \"2-4\"\n");
  RunOptions o;
  o.timeout_s = 110;
  RunResult r = run_cli({"run", "-n", "2", s.config.string(), "--set", "run.steps=8"}, o);
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const fs::path file = s.run_dir / "trace.json";
  REQUIRE(fs::exists(file));
  json trace = read_json(file);
  REQUIRE(trace.at("traceEvents").is_array());
  std::map<std::pair<int, int>, std::string> thread_names;
  for (const auto &e : trace["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name")
      thread_names[{e.at("pid").get<int>(), e.at("tid").get<int>()}] =
          e.at("args").at("name").get<std::string>();
  // (rank, stream) -> span names
  std::map<std::pair<int, std::string>, std::set<std::string>> spans;
  for (const auto &e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    INFO(e.dump());
    const int pid = e.at("pid").get<int>();
    auto name = thread_names.find({pid, e.at("tid").get<int>()});
    REQUIRE(name != thread_names.end());
    CHECK(e.at("dur").get<double>() >= 0);
    CHECK(e.at("ts").get<double>() >= 0);
    const int64_t step = e.at("args").value("step", int64_t{-1});
    CHECK(step >= 2);
    CHECK(step <= 4);
    spans[{pid, name->second}].insert(e.at("name").get<std::string>());
  }
  for (int rank : {0, 1})
    for (const char *stream : {"compute", "communication", "copy", "cpu-offload"}) {
      INFO("rank " << rank << ", stream " << stream);
      CHECK(!spans[{rank, stream}].empty());
    }
  for (int rank : {0, 1}) {
    const auto &compute = spans[{rank, "compute"}];
    for (const char *n : {"forward", "backward", "optimizer step", "finish_grads", "data wait"})
      CHECK(compute.count(n) == 1);
    CHECK(spans[{rank, "communication"}].count("all_reduce") == 1);
  }
  // The report names the trace, and every rank's memory and time.
  json sum = read_json(s.run_dir / "summary.json");
  CHECK(sum.at("files").at("trace").get<std::string>() == file.string());
  CHECK(sum.at("peak_memory_by_rank").size() == 2);
  CHECK(sum.at("time_breakdown_by_rank").size() == 2);
  CHECK(contains(r.out, "trace            " + file.string()));

  // A malformed window is a config error that names the key.
  RunResult bad =
      run_cli({"config", "check", s.config.string(), "--set", "log.trace_steps=\"5-2\""});
  CHECK(bad.status != 0);
  CHECK(contains(bad.err, "trace_steps"));
}

TEST_CASE("runs lists past runs with their status", "[viz][runs]") {
  const fs::path root = scratch() / "runs";
  Setup s = setup("", "runs/done");
  run_ok(s.config);
  // A run that stopped long ago without a summary, and one still writing.
  const std::string lines_text = read_text(s.run_dir / "metrics.jsonl");
  fs::create_directories(root / "crashed");
  write_text(root / "crashed" / "metrics.jsonl", lines_text);
  fs::last_write_time(root / "crashed" / "metrics.jsonl",
                      fs::file_time_type::clock::now() - std::chrono::hours(2));
  fs::create_directories(root / "live");
  write_text(root / "live" / "metrics.jsonl", lines_text + "{\"type\": \"train\", \"st");
  fs::create_directories(root / "not-a-run");

  RunResult r = run_cli({"runs", root.string()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  std::map<std::string, std::string> status;
  for (const auto &line : lines(r.out)) {
    auto sp = line.find(' ');
    if (sp == std::string::npos) continue;
    status[line.substr(0, sp)] = line.substr(line.find_last_of(' ') + 1);
  }
  CHECK(status.count("NAME") == 1);
  CHECK(status["done"] == "completed");
  CHECK(status["crashed"] == "incomplete");
  CHECK(status["live"] == "running");
  CHECK(status.count("not-a-run") == 0);

  RunResult j = run_cli({"runs", root.string(), "--json"});
  REQUIRE(j.status == 0);
  json rows = json::parse(j.out);
  REQUIRE(rows.size() == 3);
  for (const auto &row : rows) {
    INFO(row.dump());
    CHECK(row.at("steps").get<int64_t>() == 60);
    CHECK(row.at("train_loss").is_number());
    CHECK(row.at("samples_per_s").get<double>() > 0);
    if (row["name"] == "done") CHECK(row.at("eval_accuracy").get<double>() > 0.5);
  }

  CHECK(run_cli({"runs", "--help"}).status == 0);
  CHECK(contains(run_cli({"plot", "--help"}).out, "usage: tessera plot"));
  RunResult none = run_cli({"runs", (scratch() / "absent").string()});
  CHECK(none.status == 1);
  CHECK(contains(none.err, "no such directory"));
}

}  // namespace itest_test_viz
