// tessera plot: runs' metrics.jsonl drawn as an SVG (or a PNG through an
// installed converter).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli/args.hpp"
#include "util/error.hpp"
#include "util/regular_file.hpp"
#include "viz/plot.hpp"

extern char **environ;

namespace fs = std::filesystem;

namespace tessera::cli {

namespace {

const char *kPlotUsage = R"(usage: tessera plot RUN_DIR... [-o FILE.svg|FILE.png]

Draws each run's metrics.jsonl against step: loss (train and eval), eval
accuracy, learning rate, throughput, memory, and the loss scale of fp16
runs. Several runs overlay, one colour each, to compare them (ZeRO stages,
optimizers, learning rates).

  -o, --output FILE   where to write: .svg, or .png through rsvg-convert
                      (librsvg2-bin) or ImageMagick when one is installed.
                      Default: RUN_DIR/plot.svg for one run, plot.svg here
                      for several
  -h, --help          this help

Every run also writes RUN_DIR/plot.svg when it ends (log.plot = false
turns that off). 'tessera runs' lists the run directories.
)";

// The program's path on PATH, or "".
std::string find_program(const std::string &name) {
  const char *path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    fs::path p = fs::path(dirs.substr(start, end - start)) / name;
    if (!dirs.substr(start, end - start).empty() && ::access(p.c_str(), X_OK) == 0)
      return p.string();
    start = end + 1;
  }
  return "";
}

// Runs argv[0] with its output left on our stderr; true on exit status 0.
bool run_program(std::vector<std::string> argv) {
  std::vector<char *> args;
  for (auto &a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) return false;
  int st = 0;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return false;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

bool is_png(const std::string &path) {
  sdk::RegularFile f = sdk::open_regular_file(path);
  char magic[8] = {};
  return f && ::pread(f.fd, magic, 8, 0) == 8 && std::string(magic, 8) == "\x89PNG\r\n\x1a\n";
}

// SVG -> PNG with the first converter that works: each is checked by the
// file it leaves, since a stand-in or an ImageMagick without an SVG
// delegate can exit 0 without a PNG.
std::string convert_to_png(const std::string &svg, const std::string &png) {
  struct Converter {
    const char *program;
    std::vector<std::string> args;
  };
  const std::vector<Converter> converters = {
      {"rsvg-convert", {"-f", "png", "-b", "white", "-o", png, svg}},
      {"magick", {svg, png}},
      {"convert", {svg, png}},
  };
  std::string tried;
  for (const auto &c : converters) {
    std::string exe = find_program(c.program);
    if (exe.empty()) continue;
    std::vector<std::string> argv = {exe};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::error_code ec;
    fs::remove(png, ec);
    if (run_program(argv) && is_png(png)) return c.program;
    tried += std::string(tried.empty() ? "" : ", ") + exe + " (failed)";
  }
  return tried.empty() ? "" : "!" + tried;
}

int plot_body(const Parsed &p) {
  if (p.positional.empty()) throw UsageError("tessera plot: expected at least one RUN_DIR");
  std::vector<viz::RunMetrics> runs;
  for (const auto &dir : p.positional) {
    runs.push_back(viz::load_run_metrics(dir));
    if (runs.back().skipped > 0)
      std::fprintf(stderr, "tessera plot: %s/metrics.jsonl: skipped %d line(s) that do not parse\n",
                   dir.c_str(), runs.back().skipped);
  }
  // Two runs with one name (a/run, b/run) keep their parent in the legend.
  std::map<std::string, int> seen;
  for (const auto &r : runs) ++seen[r.label];
  for (auto &r : runs)
    if (seen[r.label] > 1) {
      fs::path abs = fs::weakly_canonical(fs::path(r.dir));
      r.label = (abs.parent_path().filename() / abs.filename()).string();
    }

  std::string out = p.get("-o", p.get("--output"));
  if (out.empty())
    out = runs.size() == 1 ? (fs::path(runs[0].dir) / "plot.svg").string() : "plot.svg";
  const bool png = out.ends_with(".png");
  if (!png && !out.ends_with(".svg"))
    throw UsageError("tessera plot: -o " + out + ": the name must end in .svg or .png");
  if (!png) {
    viz::write_plot(runs, out);
    std::printf("tessera plot: wrote %s (%zu run%s)\n", out.c_str(), runs.size(),
                runs.size() == 1 ? "" : "s");
    return 0;
  }
  const std::string svg = out.substr(0, out.size() - 4) + ".svg";
  viz::write_plot(runs, svg);
  std::string used = convert_to_png(svg, out);
  if (used.empty() || used[0] == '!') {
    std::fprintf(stderr,
                 "tessera plot: cannot write %s: %s; the SVG is at %s (any browser opens it). "
                 "For PNG output install rsvg-convert (apt-get install librsvg2-bin)\n",
                 out.c_str(),
                 used.empty()
                     ? "no SVG converter is installed (rsvg-convert or ImageMagick)"
                     : ("no converter produced a PNG (tried " + used.substr(1) + ")").c_str(),
                 svg.c_str());
    return 1;
  }
  std::printf("tessera plot: wrote %s (%zu run%s, converted by %s; the SVG is at %s)\n",
              out.c_str(), runs.size(), runs.size() == 1 ? "" : "s", used.c_str(), svg.c_str());
  return 0;
}

}  // namespace

int cmd_plot(const Args &args) {
  return run_command("plot", kPlotUsage, plot_body, args,
                     {{"-o", true, false},
                      {"--output", true, false},
                      {"--help", false, false},
                      {"-h", false, false}});
}

}  // namespace tessera::cli
