#include "harness.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace tessera::itest {

namespace {

// Variables that would make the binary a worker of some launcher, or point
// it at other plugins.
const char *const kDefaultUnset[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "TESSERA_PLUGIN_PATH",
    "TESSERA_JOB_SECRET",
};

std::string sanitize(const std::string &name) {
  std::string s;
  for (char c : name) s.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return s;
}

void write_bytes(const fs::path &p, const std::vector<uint8_t> &bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(p.c_str(), "wb");
    if (!f) throw std::runtime_error("gzopen failed: " + p.string());
    int n = gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    if (gzclose(f) != Z_OK || n != static_cast<int>(bytes.size()))
      throw std::runtime_error("gzwrite failed: " + p.string());
    return;
  }
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("write failed: " + p.string());
}

void put_be32(std::vector<uint8_t> &v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

// IDX images (magic 0x803) and labels (magic 0x801) for n samples.
void make_split(uint32_t n, uint32_t seed, std::vector<uint8_t> &images,
                std::vector<uint8_t> &labels) {
  constexpr uint32_t kSide = 8, kClasses = 4;
  std::mt19937 rng(seed);  // raw engine output is the same everywhere
  images.clear();
  labels.clear();
  put_be32(images, 0x00000803);
  put_be32(images, n);
  put_be32(images, kSide);
  put_be32(images, kSide);
  put_be32(labels, 0x00000801);
  put_be32(labels, n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t label = rng() % kClasses;
    labels.push_back(static_cast<uint8_t>(label));
    for (uint32_t r = 0; r < kSide; ++r)
      for (uint32_t c = 0; c < kSide; ++c) {
        bool lit = (label == 0 && r < 3) || (label == 1 && r >= kSide - 3) ||
                   (label == 2 && c < 3) || (label == 3 && c >= kSide - 3);
        uint32_t noise = rng() % 64;
        images.push_back(static_cast<uint8_t>(lit ? 160 + noise : noise));
      }
  }
}

}  // namespace

RunResult run_cli(const std::vector<std::string> &args, const RunOptions &opts) {
  const fs::path dir = scratch() / "proc";
  fs::create_directories(dir);
  static int counter = 0;
  const std::string tag = std::to_string(++counter);
  const fs::path out_path = dir / (tag + ".out"), err_path = dir / (tag + ".err");
  const fs::path cwd = opts.cwd.empty() ? scratch() : opts.cwd;

  std::vector<std::string> argv_s = {TESSERA_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char *> argv;
  for (auto &a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Child: only async-signal-safe-ish calls that are fine after fork in a
    // single-threaded test process.
    int o = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || in < 0) _exit(125);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    if (chdir(cwd.c_str()) != 0) _exit(126);
    for (const char *v : kDefaultUnset) unsetenv(v);
    for (const auto &v : opts.unset_env) unsetenv(v.c_str());
    for (const auto &[k, v] : opts.env) setenv(k.c_str(), v.c_str(), 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(opts.timeout_s * 1000));
  int wstatus = 0;
  bool timed_out = false;
  for (;;) {
    pid_t r = waitpid(pid, &wstatus, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR)
      throw std::runtime_error(std::string("waitpid: ") + strerror(errno));
    if (std::chrono::steady_clock::now() > deadline && !timed_out) {
      kill(pid, SIGKILL);
      timed_out = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  RunResult res;
  res.out = read_text(out_path);
  res.err = read_text(err_path);
  if (WIFEXITED(wstatus))
    res.status = WEXITSTATUS(wstatus);
  else if (WIFSIGNALED(wstatus))
    res.status = 128 + WTERMSIG(wstatus);
  if (timed_out) res.err += "\n[harness] killed after " + std::to_string(opts.timeout_s) + " s\n";
  if (res.status == 125 || res.status == 126 || res.status == 127)
    res.err +=
        "\n[harness] could not start " + std::string(TESSERA_BINARY) + " in " + cwd.string() + "\n";
  return res;
}

std::string describe(const RunResult &r) {
  return "exit status " + std::to_string(r.status) + "\n--- stdout ---\n" + r.out +
         "--- stderr ---\n" + r.err;
}

fs::path scratch() {
  static std::string current;
  const std::string name = Catch::getResultCapture().getCurrentTestName();
  const fs::path dir = fs::path(TESSERA_INTEGRATION_SCRATCH) / sanitize(name);
  if (current != name) {
    current = name;
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  return dir;
}

std::string read_text(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path &p, const std::string &text) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

nlohmann::json read_json(const fs::path &p) {
  return nlohmann::json::parse(read_text(p));
}

std::vector<nlohmann::json> read_jsonl(const fs::path &p) {
  std::vector<nlohmann::json> v;
  for (const auto &line : lines(read_text(p))) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    if (!j.is_object()) throw std::runtime_error(p.string() + ": line is not an object: " + line);
    v.push_back(std::move(j));
  }
  return v;
}

Dataset write_dataset(const fs::path &dir) {
  fs::create_directories(dir);
  Dataset d;
  d.train_images = dir / "train-images-idx3-ubyte.gz";
  d.train_labels = dir / "train-labels-idx1-ubyte";
  d.eval_images = dir / "eval-images-idx3-ubyte";
  d.eval_labels = dir / "eval-labels-idx1-ubyte";
  std::vector<uint8_t> images, labels;
  make_split(512, 1234, images, labels);
  write_bytes(d.train_images, images, true);
  write_bytes(d.train_labels, labels, false);
  make_split(256, 5678, images, labels);
  write_bytes(d.eval_images, images, false);
  write_bytes(d.eval_labels, labels, false);
  return d;
}

std::string config_text(const Dataset &data, const fs::path &run_dir, const std::string &extra) {
  std::ostringstream s;
  s << "# tessera integration test config\n"
       "[run]\n"
       "name = \"itest\"\n"
       "device = \"cpu\"\n"
       "seed = 42\n"
       "steps = 60\n"
       "log_every = 10\n"
       "dir = \""
    << run_dir.string()
    << "\"\n"
       "\n"
       "[batch]\n"
       "micro = 32\n"
       "\n"
       "[model]\n"
       "plugin = \"mlp\"\n"
       "hidden = [16]\n"
       "\n"
       "[data.train]\n"
       "plugin = \"idx\"\n"
       "images = \""
    << data.train_images.string() << "\"\nlabels = \"" << data.train_labels.string()
    << "\"\n"
       "\n"
       "[data.eval]\n"
       "plugin = \"idx\"\n"
       "images = \""
    << data.eval_images.string() << "\"\nlabels = \"" << data.eval_labels.string()
    << "\"\n"
       "\n"
       "[optimizer]\n"
       "plugin = \"adam\"\n"
       "lr = 0.01\n"
    << extra;
  return s.str();
}

Setup setup(const std::string &extra, const std::string &name) {
  Setup s;
  s.data = write_dataset(scratch() / "data");
  s.run_dir = scratch() / name;
  s.config = scratch() / (name + ".toml");
  write_text(s.config, config_text(s.data, s.run_dir, extra));
  return s;
}

std::vector<double> train_losses(const std::vector<nlohmann::json> &metrics) {
  std::vector<double> v;
  for (const auto &m : metrics)
    if (m.value("type", "") == "train") v.push_back(m.at("loss").get<double>());
  return v;
}

std::vector<std::string> lines(const std::string &text) {
  std::vector<std::string> v;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) v.push_back(line);
  return v;
}

std::vector<std::string> entries(const fs::path &dir, const std::string &prefix) {
  std::vector<std::string> v;
  for (const auto &e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0) v.push_back(n);
  }
  std::sort(v.begin(), v.end());
  return v;
}

// ---- Processes that run alongside the test ---------------------------------

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

std::string read_if_exists(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Process::Process(Process &&o) noexcept
    : pid(o.pid),
      out_path(std::move(o.out_path)),
      err_path(std::move(o.err_path)),
      timeout_s(o.timeout_s),
      started(o.started),
      reaped(o.reaped),
      result(std::move(o.result)) {
  o.pid = -1;
}

Process::~Process() {
  if (pid <= 0 || reaped) return;
  // Still running: a test gave up on it. Kill its whole process group (a
  // launcher and its workers) and reap it.
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
}

std::string Process::out() const {
  return read_if_exists(out_path);
}

std::string Process::err() const {
  return read_if_exists(err_path);
}

double Process::elapsed() const {
  return now_s() - started;
}

bool Process::poll() {
  if (reaped) return true;
  if (pid <= 0) return false;
  int st = 0;
  pid_t r = ::waitpid(pid, &st, WNOHANG);
  if (r != pid) return false;
  reaped = true;
  result.out = out();
  result.err = err();
  if (WIFEXITED(st))
    result.status = WEXITSTATUS(st);
  else if (WIFSIGNALED(st))
    result.status = 128 + WTERMSIG(st);
  if (result.status == 125 || result.status == 126 || result.status == 127)
    result.err += "\n[harness] could not start " + std::string(TESSERA_BINARY) + "\n";
  return true;
}

RunResult Process::wait() {
  bool killed = false;
  while (!poll()) {
    if (!killed && elapsed() > timeout_s) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (killed) result.err += "\n[harness] killed after " + std::to_string(timeout_s) + " s\n";
  return result;
}

Process start_cli(const std::vector<std::string> &args, const RunOptions &opts) {
  std::vector<std::string> argv = {TESSERA_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return start_command(argv, opts);
}

Process start_command(const std::vector<std::string> &argv_in, const RunOptions &opts) {
  const fs::path dir = scratch() / "proc";
  fs::create_directories(dir);
  static int counter = 0;
  const std::string tag = "bg" + std::to_string(++counter);
  Process p;
  p.out_path = dir / (tag + ".out");
  p.err_path = dir / (tag + ".err");
  p.timeout_s = opts.timeout_s;
  const fs::path cwd = opts.cwd.empty() ? scratch() : opts.cwd;

  std::vector<std::string> argv_s = argv_in;
  std::vector<char *> argv;
  for (auto &a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  p.started = now_s();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    int o = open(p.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(p.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || in < 0) _exit(125);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    if (chdir(cwd.c_str()) != 0) _exit(126);
    for (const char *v : kDefaultUnset) unsetenv(v);
    for (const auto &v : opts.unset_env) unsetenv(v.c_str());
    for (const auto &[k, v] : opts.env) setenv(k.c_str(), v.c_str(), 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ::setpgid(pid, pid);  // also here, so it holds before we signal the group
  p.pid = pid;
  return p;
}

bool wait_for_text(Process &p, const std::string &text, double timeout_s, bool in_stderr) {
  const double until = now_s() + timeout_s;
  for (;;) {
    const bool gone = p.poll();
    if ((in_stderr ? p.err() : p.out()).find(text) != std::string::npos) return true;
    if (gone || now_s() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<int> child_pids(int pid) {
  std::vector<int> v;
  const fs::path tasks = fs::path("/proc") / std::to_string(pid) / "task";
  std::error_code ec;
  for (const auto &t : fs::directory_iterator(tasks, ec)) {
    std::istringstream in(read_if_exists(t.path() / "children"));
    for (int c; in >> c;)
      if (std::find(v.begin(), v.end(), c) == v.end()) v.push_back(c);
  }
  std::sort(v.begin(), v.end());
  return v;
}

bool process_running(int pid) {
  const std::string stat = read_if_exists(fs::path("/proc") / std::to_string(pid) / "stat");
  if (stat.empty()) return false;
  // "pid (comm) S ...": the state follows the last ')'.
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

std::string process_env(int pid, const std::string &name) {
  const std::string env = read_if_exists(fs::path("/proc") / std::to_string(pid) / "environ");
  const std::string prefix = name + "=";
  size_t start = 0;
  while (start < env.size()) {
    size_t end = env.find('\0', start);
    if (end == std::string::npos) end = env.size();
    if (env.compare(start, prefix.size(), prefix) == 0)
      return env.substr(start + prefix.size(), end - start - prefix.size());
    start = end + 1;
  }
  return "";
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("bind: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

std::map<std::string, F32Tensor> read_safetensors_f32(const fs::path &p) {
  const std::string bytes = read_text(p);
  if (bytes.size() < 8) throw std::runtime_error(p.string() + ": too short for safetensors");
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i)
    len = (len << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  if (len > bytes.size() - 8) throw std::runtime_error(p.string() + ": header length past the end");
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, len));
  const size_t base = 8 + len;
  std::map<std::string, F32Tensor> out;
  for (const auto &[name, t] : header.items()) {
    if (name == "__metadata__") continue;
    if (t.at("dtype") != "F32")
      throw std::runtime_error(p.string() + ": tensor '" + name + "' is " +
                               t.at("dtype").get<std::string>() + ", not F32");
    F32Tensor x;
    size_t numel = 1;
    for (const auto &d : t.at("shape")) {
      x.shape.push_back(d.get<int64_t>());
      numel *= d.get<size_t>();
    }
    const size_t begin = t.at("data_offsets").at(0).get<size_t>();
    const size_t end = t.at("data_offsets").at(1).get<size_t>();
    if (end < begin || end - begin != numel * 4 || base + end > bytes.size())
      throw std::runtime_error(p.string() + ": tensor '" + name + "' has bad data offsets");
    x.data.resize(numel);
    // Little-endian F32, as safetensors stores it (and as x86/arm64 hosts are).
    std::memcpy(x.data.data(), bytes.data() + base + begin, numel * 4);
    out.emplace(name, std::move(x));
  }
  return out;
}

// ---- Multi-process jobs ------------------------------------------------------

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

bool starts_with(const std::string &s, const std::string &prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The launcher's own verdict: its last "tessera run: failed: " line.
std::string launcher_verdict(const std::string &err) {
  std::string found;
  for (const auto &line : lines(err))
    if (starts_with(line, "tessera run: failed: ")) found = line;
  return found;
}

// Lines of `text` that worker `rank` printed (the launcher's prefix).
std::vector<std::string> rank_lines(const std::string &text, int rank) {
  std::vector<std::string> v;
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  for (const auto &line : lines(text))
    if (starts_with(line, prefix)) v.push_back(line);
  return v;
}

bool any_line_has(const std::vector<std::string> &ls, const std::vector<std::string> &parts) {
  for (const auto &l : ls) {
    bool all = true;
    for (const auto &p : parts) all = all && contains(l, p);
    if (all) return true;
  }
  return false;
}

// The launcher's workers, by rank (RANK in their environment), once all `n`
// are there.
std::map<int, int> workers_of(Process &launcher, int n, double timeout_s) {
  const double until = now_s() + timeout_s;
  std::map<int, int> by_rank;
  while (now_s() < until && !launcher.poll()) {
    by_rank.clear();
    for (int pid : child_pids(launcher.pid)) {
      const std::string r = process_env(pid, "RANK");
      if (!r.empty()) by_rank[std::stoi(r)] = pid;
    }
    if (static_cast<int>(by_rank.size()) == n) return by_rank;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return by_rank;
}

// Waits until the process exits or `timeout_s` passes; true if it exited.
bool exits_within(Process &p, double timeout_s) {
  const double until = now_s() + timeout_s;
  while (!p.poll()) {
    if (now_s() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::string still_running(const std::map<int, int> &workers) {
  std::string s;
  for (const auto &[rank, pid] : workers)
    if (process_running(pid))
      s += "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") ";
  return s;
}

}  // namespace tessera::itest
