#include "viz/plot.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "util/error.hpp"
#include "util/regular_file.hpp"
#include "viz/svg.hpp"

namespace fs = std::filesystem;

namespace tessera::viz {

namespace {

using Points = std::vector<std::pair<double, double>>;

// What one panel shows: up to two series, each a (line type, key) of
// metrics.jsonl. Sparse series (eval) get markers and a dashed line.
struct SeriesSpec {
  const char *name;  // data-series and legend text
  const char *type;  // "train" | "eval"
  const char *key;
  bool dashed;
};
struct PanelSpec {
  const char *title, *unit;
  std::vector<SeriesSpec> series;
  double scale;    // multiplies values (bytes -> MiB)
  bool zero_base;  // y axis starts at 0 (quantities, not losses)
  bool always;     // shown even without data
  double ceiling = std::numeric_limits<double>::infinity();  // no tick above (accuracy: 1)
};

const std::vector<PanelSpec> &panel_specs() {
  static const std::vector<PanelSpec> specs = {
      {"loss",
       "loss",
       {{"train loss", "train", "loss", false}, {"eval loss", "eval", "eval_loss", true}},
       1,
       false,
       true},
      {"eval accuracy",
       "accuracy",
       {{"eval accuracy", "eval", "eval_accuracy", true}},
       1,
       false,
       false,
       1.0},
      {"learning rate", "lr", {{"lr", "train", "lr", false}}, 1, true, true},
      {"throughput", "samples/s", {{"samples/s", "train", "samples_per_s", false}}, 1, true, true},
      {"memory (engine allocations, rank 0)",
       "MiB",
       {{"memory", "train", "memory_bytes", false}},
       1.0 / 1048576.0,
       true,
       false},
      {"loss scale (fp16)",
       "scale",
       {{"loss scale", "train", "loss_scale", false}},
       1,
       false,
       false},
  };
  return specs;
}

const char *kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

Points series_points(const RunMetrics &r, const SeriesSpec &s, double scale) {
  Points p;
  for (const auto &l : r.lines) {
    if (!l.is_object() || l.value("type", "") != s.type) continue;
    auto step = l.find("step");
    auto v = l.find(s.key);
    if (step == l.end() || v == l.end() || !step->is_number() || !v->is_number()) continue;
    double y = v->get<double>() * scale;
    if (std::isfinite(y)) p.emplace_back(step->get<double>(), y);
  }
  return p;
}

// Tick spacing of 1, 2, 2.5 or 5 times a power of ten giving about `n`
// intervals over [lo, hi].
double nice_step(double lo, double hi, int n) {
  double raw = (hi - lo) / n;
  if (!(raw > 0)) return 1;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

struct Axis {
  double lo = 0, hi = 1, step = 0.2;
};

Axis make_axis(double lo, double hi, bool zero_base, int n) {
  if (zero_base && lo > 0) lo = 0;
  if (!(hi > lo)) {  // one value: a band around it
    double pad = lo != 0 ? std::fabs(lo) * 0.1 : 1;
    lo -= pad;
    hi += pad;
    if (zero_base && lo < 0 && hi > 0 && lo + pad >= 0) lo = 0;
  }
  Axis a;
  a.step = nice_step(lo, hi, n);
  a.lo = std::floor(lo / a.step + 1e-9) * a.step;
  a.hi = std::ceil(hi / a.step - 1e-9) * a.step;
  if (a.hi <= a.lo) a.hi = a.lo + a.step;
  return a;
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-6) return "0";
  char buf[32];
  double a = std::fabs(v);
  if (a >= 1e6)
    std::snprintf(buf, sizeof buf, "%gM", v / 1e6);
  else if (a >= 1e4)
    std::snprintf(buf, sizeof buf, "%gk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string attr(const char *name, const std::string &value) {
  return std::string(name) + "=\"" + xml_escape(value) + "\"";
}

// Geometry: two columns of panels below a legend band.
constexpr double kWidth = 1000, kPanelW = 500, kPanelH = 280, kLegendH = 56;
constexpr double kLeft = 72, kRight = 22, kTop = 34, kBottom = 44;

struct Drawn {
  const RunMetrics *run;
  size_t color;
  const SeriesSpec *spec;
  Points pts;
};

void draw_panel(Svg &svg, double ox, double oy, const PanelSpec &spec, const Axis &xa,
                const std::vector<Drawn> &series) {
  const double x0 = ox + kLeft, x1 = ox + kPanelW - kRight;
  const double y0 = oy + kTop, y1 = oy + kPanelH - kBottom;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto &d : series)
    for (const auto &p : d.pts) {
      lo = std::min(lo, p.second);
      hi = std::max(hi, p.second);
    }
  const bool empty = !std::isfinite(lo);
  Axis ya = empty ? Axis{} : make_axis(lo, hi, spec.zero_base, 5);
  if (ya.hi > spec.ceiling && hi <= spec.ceiling) ya.hi = std::max(spec.ceiling, ya.lo + ya.step);
  auto sx = [&](double v) { return x0 + (v - xa.lo) / (xa.hi - xa.lo) * (x1 - x0); };
  auto sy = [&](double v) { return y1 - (v - ya.lo) / (ya.hi - ya.lo) * (y1 - y0); };

  svg.open_group(attr("class", "panel") + " " + attr("data-panel", spec.title));
  svg.text(x0, oy + 20, spec.title, 14, "start", "class=\"panel-title\" font-weight=\"bold\"");
  // Grid and ticks.
  const Stroke grid{"#e4e4e4", 1, ""}, axis{"#444", 1, ""};
  for (double v = ya.lo; v <= ya.hi + ya.step * 1e-6; v += ya.step) {
    svg.line(x0, sy(v), x1, sy(v), grid);
    svg.text(x0 - 6, sy(v) + 4, tick_label(v, ya.step), 11, "end", "class=\"tick\"");
  }
  for (double v = xa.lo; v <= xa.hi + xa.step * 1e-6; v += xa.step) {
    svg.line(sx(v), y0, sx(v), y1, grid);
    svg.line(sx(v), y1, sx(v), y1 + 4, axis);
    svg.text(sx(v), y1 + 17, tick_label(v, xa.step), 11, "middle", "class=\"tick\"");
  }
  svg.line(x0, y1, x1, y1, axis);
  svg.line(x0, y0, x0, y1, axis);
  svg.text(x0 + (x1 - x0) / 2, y1 + 34, "step", 12, "middle", "class=\"axis-label\"");
  svg.text(ox + 16, y0 + (y1 - y0) / 2, spec.unit, 12, "middle", "class=\"axis-label\"", -90);
  if (empty) svg.text(x0 + (x1 - x0) / 2, y0 + (y1 - y0) / 2, "no data", 13, "middle");

  for (const auto &d : series) {
    const std::string color = kPalette[d.color % std::size(kPalette)];
    Points px;
    for (const auto &p : d.pts) px.emplace_back(sx(p.first), sy(p.second));
    std::string a = attr("class", "series") + " " + attr("data-panel", spec.title) + " " +
                    attr("data-series", d.spec->name) + " " + attr("data-run", d.run->label) + " " +
                    attr("data-points", std::to_string(px.size()));
    svg.polyline(px, Stroke{color, d.spec->dashed ? 1.6 : 1.8, d.spec->dashed ? "6 4" : ""}, a);
    // Markers where points are few (eval) or a line could not show one.
    if (d.spec->dashed || px.size() < 2)
      for (const auto &p : px) svg.circle(p.first, p.second, 3, color, "class=\"marker\"");
  }
  // Which line is which, where a panel mixes kinds (train solid, eval dashed).
  if (spec.series.size() > 1) {
    double lx = x1 - 150, ly = y0 + 6;
    svg.rect(lx - 6, ly - 4, 156, 16.0 * static_cast<double>(spec.series.size()) + 6, "#ffffff",
             "#cccccc");
    for (const auto &s : spec.series) {
      svg.line(lx, ly + 6, lx + 26, ly + 6, Stroke{"#444", 1.8, s.dashed ? "6 4" : ""});
      svg.text(lx + 32, ly + 10, s.name, 11, "start", "class=\"legend\"");
      ly += 16;
    }
  }
  svg.close_group();
}

}  // namespace

RunMetrics load_run_metrics(const std::string &dir) {
  RunMetrics r;
  r.dir = dir;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(dir), ec);
  if (ec) p = fs::path(dir).lexically_normal();
  r.label = (p.has_filename() ? p.filename() : p.parent_path().filename()).string();
  fs::path file = fs::path(dir) / "metrics.jsonl";
  std::error_code exists_ec;
  if (!fs::exists(file, exists_ec))
    throw Error(TSR_ERR_IO, file.string() + ": cannot read (is " + dir +
                                " a run directory? 'tessera runs' lists them)");
  std::istringstream in(
      read_regular(file.string(), "metrics file", std::numeric_limits<uint64_t>::max()));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    try {
      r.lines.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception &) {
      ++r.skipped;
    }
  }
  return r;
}

std::string render_plot(const std::vector<RunMetrics> &runs) {
  // Panels with data (or always shown), each with its series per run.
  struct Panel {
    const PanelSpec *spec;
    std::vector<Drawn> series;
  };
  std::vector<Panel> panels;
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin;
  for (const auto &spec : panel_specs()) {
    Panel panel{&spec, {}};
    for (size_t r = 0; r < runs.size(); ++r)
      for (const auto &s : spec.series) {
        Points pts = series_points(runs[r], s, spec.scale);
        if (pts.empty()) continue;
        for (const auto &p : pts) {
          xmin = std::min(xmin, p.first);
          xmax = std::max(xmax, p.first);
        }
        panel.series.push_back(Drawn{&runs[r], r, &s, std::move(pts)});
      }
    if (spec.always || !panel.series.empty()) panels.push_back(std::move(panel));
  }
  if (!std::isfinite(xmin)) xmin = xmax = 0;
  // Steps count from 0 on the shared x axis, so runs of any length compare.
  Axis xa = make_axis(std::min(0.0, xmin), std::max(xmax, 1.0), true, 6);

  const double rows = std::ceil(static_cast<double>(panels.size()) / 2.0);
  std::string names;
  for (const auto &r : runs) names += (names.empty() ? "" : ", ") + r.label;
  Svg svg(kWidth, kLegendH + rows * kPanelH + 8, "tessera: " + names);

  // The legend: one colour per run, shared by every panel.
  svg.open_group("class=\"legend-box\"");
  double lx = 20, ly = 24;
  svg.text(lx, ly, runs.size() == 1 ? "run" : "runs", 13, "start", "font-weight=\"bold\"");
  lx += runs.size() == 1 ? 40 : 48;
  for (size_t r = 0; r < runs.size(); ++r) {
    const double w = 40 + 7.5 * static_cast<double>(runs[r].label.size());
    if (lx + w > kWidth - 20) {
      lx = 68;
      ly += 20;
    }
    svg.line(lx, ly - 4, lx + 24, ly - 4, Stroke{kPalette[r % std::size(kPalette)], 3, ""});
    svg.text(lx + 30, ly, runs[r].label, 13, "start",
             "class=\"legend\" " + attr("data-run", runs[r].label));
    lx += w;
  }
  svg.text(kWidth - 20, 24, "tessera plot", 11, "end", "fill-opacity=\"0.6\"");
  svg.close_group();

  for (size_t i = 0; i < panels.size(); ++i) {
    double ox = (i % 2) * kPanelW, oy = kLegendH + std::floor(static_cast<double>(i) / 2) * kPanelH;
    draw_panel(svg, ox, oy, *panels[i].spec, xa, panels[i].series);
  }
  return svg.finish();
}

void write_plot(const std::vector<RunMetrics> &runs, const std::string &path) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << render_plot(runs);
    if (!out) throw Error(TSR_ERR_IO, tmp + ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error(TSR_ERR_IO, path + ": cannot write: " + ec.message());
}

}  // namespace tessera::viz
